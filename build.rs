// `sqlx::migrate!` embeds the migration files at compile time, but cargo
// does not know that it reads them: without this, a new or edited migration
// would not rebuild the crate.
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}

//! Progress of long commands (import, export, the benchmarks' loads): a bar
//! with the count, the rate and, when the total is known, the time left, on
//! standard error. Drawn only when standard error is a terminal: in logs
//! and pipes the commands print their usual one-line summaries and nothing
//! else.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A bar over `total` items (or, without a total, a counter with its rate).
pub fn items(what: &str, total: Option<u64>) -> ProgressBar {
    let template = match total {
        Some(_) => "{msg} {wide_bar} {pos}/{len} ({per_sec}, {eta} left)",
        None => "{msg} {spinner} {pos} ({per_sec}, {elapsed})",
    };
    styled(total, template, what)
}

/// A bar over `total` bytes read (or, without a total, a byte counter).
pub fn bytes(what: &str, total: Option<u64>) -> ProgressBar {
    let template = match total {
        Some(_) => "{msg} {wide_bar} {bytes}/{total_bytes} ({bytes_per_sec}, {eta} left)",
        None => "{msg} {spinner} {bytes} ({bytes_per_sec}, {elapsed})",
    };
    styled(total, template, what)
}

fn styled(total: Option<u64>, template: &str, what: &str) -> ProgressBar {
    // `stderr()` draws nothing when standard error is not a terminal.
    let bar = ProgressBar::with_draw_target(total, ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template(template) {
        bar.set_style(style);
    }
    bar.set_message(what.to_string());
    bar
}

//! The bundled embedding model, sentence-transformers all-MiniLM-L6-v2 (384-d),
//! run in-process: no service, no network, no Python. Two runtimes, chosen by
//! `embedding.local.runtime`, each its own model id (vector space):
//!
//! - `onnx-int8` (default), model id `all-MiniLM-L6-v2-int8`: the model
//!   exported to ONNX with int8 weights, on ONNX Runtime, whose shared library
//!   is loaded from the model directory at start (`ort` with `load-dynamic`:
//!   nothing is linked or downloaded at build time). The export computes its
//!   products in f32 (its weights are turned back into floats); the query
//!   worker instead runs them in int8 on the same weights
//!   (`embedding.local.int8_queries`, [`Products::Int8`]), which halves a
//!   query's embedding time. Stored memories are always embedded with the f32
//!   products, so the stored vectors are the export's own, and a query's vector
//!   differs from its f32 one only by the rounding of its activations.
//! - `candle`, model id `all-MiniLM-L6-v2`: the original f32 weights on
//!   candle, pure Rust, for platforms the fetched ONNX Runtime does not run on.
//!
//! The files are loaded from a directory that `scripts/fetch-model.sh` fills;
//! the server never downloads. Every file is checked against its pinned
//! sha256 at load (the runtime library too, before it is loaded), so a missing
//! or corrupt file stops the server at start (with a message naming the
//! script) instead of serving wrong vectors.
//!
//! Inference is CPU-bound and must not run on the async workers. One dedicated
//! thread owns the model and is fed by a channel. ONNX Runtime gets
//! `embedding.local.threads` intra-op threads. candle computes inside a rayon
//! pool of that many threads (it parallelises its matrix products over the
//! current rayon pool) and also keeps a pool of its own for element-wise work,
//! sized from the environment: [`pin_candle_threads`], called in `main`
//! before the runtime starts, sizes it to the same count, so the embedder uses
//! no more cores than configured.
//! Requests that arrive within `batch_window_ms` of each other (up to
//! `max_batch` texts) are embedded together and each caller gets its own
//! vectors back. The worker waits that window only while requests overlap
//! (its last batch held several): a lone request does not pay for it.
//!
//! The recipe is sentence-transformers': WordPiece with the model's own
//! tokenizer, padding to the longest sequence of a batch (the tokenizer file's
//! fixed 128-token padding is switched off: it is slower and changes nothing
//! but cost), mean pooling over the attention mask, then L2 normalisation.
//!
//! Long texts: the model sees at most 256 tokens. A longer text is not cut:
//! its tokens are split into windows of 256 (254 plus `[CLS]` and `[SEP]`)
//! that overlap by [`CHUNK_OVERLAP`] tokens, the last window ending at the
//! text's end so every window is full, and the text's vector is the
//! normalised mean of the windows' vectors. Every part of the text counts
//! about equally; the cost grows linearly with length (about 0.1 s of one core
//! per window on candle; content is capped at 32 KiB, so at most some 150
//! windows in the worst case of one token per byte, during which the queue
//! waits).

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock, mpsc};
use std::time::Duration;

use anyhow::Context;
use async_trait::async_trait;
use candle_core::{D, DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::{BertModel, Config as BertConfig};
use ort::environment::Environment;
use ort::session::Session;
use sha2::{Digest, Sha256};
use tokenizers::Tokenizer;
use tokio::sync::oneshot;

use super::queue::{Class, Held, Job, Lane, Load, Settings, worker};
use super::{EmbedError, Embedder, normalize};
use crate::config::{LocalConfig, LocalRuntime};

/// The model id of the candle runtime (the original f32 weights).
pub const MODEL_ID: &str = "all-MiniLM-L6-v2";
/// The model id of the ONNX Runtime on int8 weights: a vector space of its own.
pub const MODEL_ID_INT8: &str = "all-MiniLM-L6-v2-int8";
pub const DIMENSIONS: usize = 384;
/// The model's sequence length (sentence-transformers' `max_seq_length`).
pub const MAX_TOKENS: usize = 256;
/// Most tokens (padded sequences × their length) in one forward pass. Larger
/// passes gain nothing on a CPU (measured: the same CPU time per token from 512
/// to 8192) but their attention matrices (batch × 12 × length² floats) grow:
/// 32 windows of 256 tokens would allocate 100 MB per attention step.
pub const MAX_BATCH_TOKENS: usize = 1024;
/// Tokens shared by consecutive windows of a long text, so that no sentence is
/// seen only cut in two.
pub const CHUNK_OVERLAP: usize = 32;

/// The files each runtime reads, with the sha256 pinned in
/// `scripts/fetch-model.sh`; the tokenizer comes first.
const TOKENIZER: (&str, &str) = ("tokenizer.json", "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037");
const CANDLE_FILES: [(&str, &str); 2] = [
    ("config.json", "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41"),
    ("model.safetensors", "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"),
];
const ONNX_MODEL: (&str, &str) =
    ("model-int8.onnx", "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6");
/// ONNX Runtime 1.31.1 for Linux x86_64, from the `onnxruntime` wheel.
const ONNX_RUNTIME: (&str, &str) =
    ("libonnxruntime.so.1.31.1", "fc44112fbe06d7d689c57e11d3862031f64711007e4ee020f8eed5185fd2c1d3");

const FETCH_HINT: &str = "run scripts/fetch-model.sh";

/// Reads `dir/name` and checks its sha256; errors name the fetch script.
fn read_verified(dir: &Path, (name, sha256): (&str, &str)) -> anyhow::Result<Vec<u8>> {
    let path = dir.join(name);
    let bytes = std::fs::read(&path).with_context(|| {
        format!("the local embedding model is missing {} ({FETCH_HINT} {} to fetch it)", path.display(), dir.display())
    })?;
    let got = hex::encode(Sha256::digest(&bytes));
    anyhow::ensure!(
        got == sha256,
        "the local embedding model file {} is corrupt or not the pinned file (sha256 {got}, expected {sha256}); \
         {FETCH_HINT} {} to fetch it again",
        path.display(),
        dir.display()
    );
    Ok(bytes)
}

/// The process's one ONNX Runtime environment, loading the library at
/// `path` the first time. ONNX Runtime allows one environment per process, so
/// a second embedder reuses the first one's library.
fn onnx_environment(path: &Path) -> anyhow::Result<Environment> {
    static ENVIRONMENT: OnceLock<Environment> = OnceLock::new();
    if let Some(env) = ENVIRONMENT.get() {
        return Ok(env.clone());
    }
    let env = ort::init_from(path)
        .map_err(|e| anyhow::anyhow!("loading ONNX Runtime from {}: {e}", path.display()))?
        .with_name("engram")
        .build()
        .map_err(|e| anyhow::anyhow!("starting ONNX Runtime: {e}"))?;
    Ok(ENVIRONMENT.get_or_init(|| env).clone())
}

/// How the ONNX graph computes its weight products.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Products {
    /// As the export does: the int8 weights turned back into floats, f32
    /// products. Every stored vector is made this way.
    F32,
    /// Int8 products on the same weights, the activations quantized at each
    /// call (src/embed/int8_products.rs): about half the time, and vectors
    /// within a cosine of about 0.99 of the f32 ones. For queries.
    Int8,
}

/// What computes the token vectors.
enum Runtime {
    Candle(Box<BertModel>),
    /// `Session::run` takes `&mut`; the lock is only ever taken by the one
    /// thread that embeds.
    Onnx(Mutex<Session>),
}

/// The model itself: synchronous, for one thread at a time. [`LocalEmbedder`]
/// is the async, batching front; benchmarks may use this directly.
pub struct MiniLm {
    runtime: Runtime,
    products: Products,
    tokenizer: Tokenizer,
    cls: u32,
    sep: u32,
    pad: u32,
}

impl MiniLm {
    /// Loads and verifies the model in `dir` for `runtime`; ONNX Runtime gets
    /// `threads` threads (candle runs in the caller's rayon pool). Takes
    /// about half a second, most of it hashing the weights.
    pub fn load(dir: &Path, runtime: LocalRuntime, threads: usize) -> anyhow::Result<Self> {
        Self::load_with(dir, runtime, threads, Products::F32)
    }

    /// [`MiniLm::load`] with the weight products of `products` (candle
    /// always computes in f32).
    pub fn load_with(dir: &Path, runtime: LocalRuntime, threads: usize, products: Products) -> anyhow::Result<Self> {
        let mut tokenizer = Tokenizer::from_bytes(read_verified(dir, TOKENIZER)?)
            .map_err(|e| anyhow::anyhow!("tokenizer.json: {e}"))?;
        // Windows and padding are done here (see the module comment), not by the
        // tokenizer file's fixed 128-token settings.
        tokenizer.with_truncation(None).map_err(|e| anyhow::anyhow!("tokenizer.json: {e}"))?;
        tokenizer.with_padding(None);
        let id = |token: &str| tokenizer.token_to_id(token).with_context(|| format!("tokenizer.json has no {token}"));
        let (cls, sep, pad) = (id("[CLS]")?, id("[SEP]")?, id("[PAD]")?);
        let runtime = match runtime {
            LocalRuntime::Candle => {
                let [config, weights] = CANDLE_FILES.map(|file| read_verified(dir, file));
                let config: BertConfig = serde_json::from_slice(&config?).context("parsing config.json")?;
                anyhow::ensure!(config.hidden_size == DIMENSIONS, "config.json: hidden_size is not {DIMENSIONS}");
                let weights = weights?;
                let vb = VarBuilder::from_slice_safetensors(&weights, DType::F32, &Device::Cpu)
                    .context("reading model.safetensors")?;
                Runtime::Candle(Box::new(BertModel::load(vb, &config).context("loading the BERT weights")?))
            }
            LocalRuntime::OnnxInt8 => {
                // Checked before it is loaded: a library runs code when opened.
                read_verified(dir, ONNX_RUNTIME)?;
                let mut model = read_verified(dir, ONNX_MODEL)?;
                if products == Products::Int8 {
                    let (rewritten, changed) = super::int8_products::rewrite(&model)
                        .with_context(|| format!("rewriting {} for int8 products", ONNX_MODEL.0))?;
                    // The pinned export has six linear layers in each of its six blocks.
                    anyhow::ensure!(changed == 36, "{}: {changed} int8 products instead of 36", ONNX_MODEL.0);
                    model = rewritten;
                }
                let env = onnx_environment(&dir.join(ONNX_RUNTIME.0))?;
                let session = Session::builder(&env)
                    .and_then(|b| Ok(b.with_intra_threads(threads)?))
                    .and_then(|b| Ok(b.with_inter_threads(1)?))
                    .and_then(|b| Ok(b.with_parallel_execution(false)?))
                    // Idle intra-op threads sleep instead of spinning on a core.
                    .and_then(|b| Ok(b.with_intra_op_spinning(false)?))
                    .and_then(|mut b| b.commit_from_memory(&model))
                    .map_err(|e| anyhow::anyhow!("loading {} into ONNX Runtime: {e}", ONNX_MODEL.0))?;
                Runtime::Onnx(Mutex::new(session))
            }
        };
        let products = if matches!(runtime, Runtime::Onnx(_)) { products } else { Products::F32 };
        Ok(Self { runtime, products, tokenizer, cls, sep, pad })
    }

    /// The id of the vector space this model's vectors live in.
    pub fn model_id(&self) -> &'static str {
        match self.runtime {
            Runtime::Candle(_) => MODEL_ID,
            Runtime::Onnx(_) => MODEL_ID_INT8,
        }
    }

    /// One unit vector per text, long texts as averaged windows. Sequences are
    /// sorted by length and run at most `max_batch` (and [`MAX_BATCH_TOKENS`])
    /// at a time, each forward pass padded to its longest sequence.
    pub fn embed(&self, texts: &[&str], max_batch: usize) -> anyhow::Result<Vec<Vec<f32>>> {
        self.embed_with(texts, max_batch, false)
    }

    /// sentence-transformers' own rule, for comparison only: a text longer
    /// than 256 tokens is cut there and the rest ignored.
    pub fn embed_truncated(&self, texts: &[&str], max_batch: usize) -> anyhow::Result<Vec<Vec<f32>>> {
        self.embed_with(texts, max_batch, true)
    }

    fn embed_with(&self, texts: &[&str], max_batch: usize, truncate: bool) -> anyhow::Result<Vec<Vec<f32>>> {
        let seqs = self.sequences(texts, truncate)?;
        let mut sums = Sums::new(texts.len());
        let mut rest = seqs.as_slice();
        while !rest.is_empty() {
            let take = group_len(rest.iter().map(|(_, ids)| ids.len()), max_batch, MAX_BATCH_TOKENS);
            let (group, tail) = rest.split_at(take);
            rest = tail;
            let vectors = self.forward(group.iter().map(|(_, ids)| ids.as_slice()))?;
            for ((text, _), v) in group.iter().zip(vectors) {
                sums.add(*text, &v);
            }
        }
        Ok(sums.finish())
    }

    /// Every window of every text as (text index, token ids with `[CLS]` and
    /// `[SEP]`), longest first: consecutive sequences then make forward
    /// passes of similar lengths that waste little on padding.
    pub(super) fn sequences(&self, texts: &[&str], truncate: bool) -> anyhow::Result<Vec<(usize, Vec<u32>)>> {
        let mut seqs: Vec<(usize, Vec<u32>)> = Vec::with_capacity(texts.len());
        for (i, text) in texts.iter().enumerate() {
            let encoding = self.tokenizer.encode(*text, false).map_err(|e| anyhow::anyhow!("tokenizing: {e}"))?;
            let ids = encoding.get_ids();
            let windows = if truncate { vec![&ids[..ids.len().min(MAX_TOKENS - 2)]] } else { windows(ids) };
            for window in windows {
                let mut ids = Vec::with_capacity(window.len() + 2);
                ids.push(self.cls);
                ids.extend_from_slice(window);
                ids.push(self.sep);
                seqs.push((i, ids));
            }
        }
        seqs.sort_by_key(|(_, ids)| std::cmp::Reverse(ids.len()));
        Ok(seqs)
    }

    /// Mean-pooled, normalised vectors of up to `max_batch` token sequences.
    pub(super) fn forward<'a>(
        &self,
        seqs: impl ExactSizeIterator<Item = &'a [u32]> + Clone,
    ) -> anyhow::Result<Vec<Vec<f32>>> {
        // Int8 products quantize a pass's activations with one scale for the
        // whole pass, so a text's vector would depend on what it was batched
        // with (and on the padding): each sequence gets a pass of its own.
        if self.products == Products::Int8 && seqs.len() > 1 {
            let mut out = Vec::with_capacity(seqs.len());
            for seq in seqs {
                out.extend(self.forward(std::iter::once(seq))?);
            }
            return Ok(out);
        }
        let n = seqs.len();
        let len = seqs.clone().map(<[u32]>::len).max().unwrap_or(0);
        let mut ids = Vec::with_capacity(n * len);
        let mut mask = Vec::with_capacity(n * len);
        for seq in seqs {
            ids.extend_from_slice(seq);
            ids.extend(std::iter::repeat_n(self.pad, len - seq.len()));
            mask.extend(std::iter::repeat_n(1u32, seq.len()));
            mask.extend(std::iter::repeat_n(0u32, len - seq.len()));
        }
        match &self.runtime {
            Runtime::Candle(bert) => candle_forward(bert, ids, mask, n, len),
            Runtime::Onnx(session) => {
                let mut session = session.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                onnx_forward(&mut session, &ids, &mask, n, len)
            }
        }
    }
}

/// Mean-pooled, normalised vectors on candle; `ids` and `mask` are `n` rows of `len`.
fn candle_forward(
    bert: &BertModel,
    ids: Vec<u32>,
    mask: Vec<u32>,
    n: usize,
    len: usize,
) -> anyhow::Result<Vec<Vec<f32>>> {
    let device = Device::Cpu;
    let ids = Tensor::from_vec(ids, (n, len), &device)?;
    let mask = Tensor::from_vec(mask, (n, len), &device)?;
    let type_ids = ids.zeros_like()?;
    let hidden = bert.forward(&ids, &type_ids, Some(&mask))?; // (n, len, 384)
    // Mean over the real tokens only: padding is masked out of the sum and the count.
    let mask = mask.to_dtype(DType::F32)?.unsqueeze(2)?; // (n, len, 1)
    let summed = hidden.broadcast_mul(&mask)?.sum(1)?; // (n, 384)
    let counts = mask.sum(1)?; // (n, 1)
    let mean = summed.broadcast_div(&counts)?;
    let norms = mean.sqr()?.sum_keepdim(D::Minus1)?.sqrt()?;
    Ok(mean.broadcast_div(&norms)?.to_vec2::<f32>()?)
}

/// Mean-pooled, normalised vectors on ONNX Runtime; `ids` and `mask` are `n` rows of `len`.
fn onnx_forward(
    session: &mut Session,
    ids: &[u32],
    mask: &[u32],
    n: usize,
    len: usize,
) -> anyhow::Result<Vec<Vec<f32>>> {
    let ort_error = |e: ort::Error| anyhow::anyhow!("ONNX Runtime: {e}");
    let tensor = |values: Vec<i64>| ort::value::Tensor::from_array(([n, len], values)).map_err(ort_error);
    let inputs = ort::inputs![
        "input_ids" => tensor(ids.iter().map(|&x| i64::from(x)).collect())?,
        "attention_mask" => tensor(mask.iter().map(|&x| i64::from(x)).collect())?,
        "token_type_ids" => tensor(vec![0; n * len])?,
    ];
    let outputs = session.run(inputs).map_err(ort_error)?;
    let (shape, hidden) = outputs["last_hidden_state"].try_extract_tensor::<f32>().map_err(ort_error)?;
    anyhow::ensure!(
        shape.iter().copied().eq([n as i64, len as i64, DIMENSIONS as i64]),
        "ONNX Runtime: last_hidden_state has shape {shape:?}, expected [{n}, {len}, {DIMENSIONS}]"
    );
    let mut out = Vec::with_capacity(n);
    for (row, (states, mask)) in hidden.chunks_exact(len * DIMENSIONS).zip(mask.chunks_exact(len)).enumerate() {
        // Mean over the real tokens only, as on candle.
        let mut mean = vec![0.0f32; DIMENSIONS];
        let mut count = 0.0f32;
        for (token, _) in states.chunks_exact(DIMENSIONS).zip(mask).filter(|(_, m)| **m == 1) {
            mean.iter_mut().zip(token).for_each(|(s, x)| *s += x);
            count += 1.0;
        }
        anyhow::ensure!(count > 0.0, "ONNX Runtime: sequence {row} has no tokens");
        mean.iter_mut().for_each(|s| *s /= count);
        normalize(&mut mean);
        out.push(mean);
    }
    Ok(out)
}

/// How many of `lengths` (sequence lengths, longest first) one forward pass
/// takes: at most `max_batch` sequences and `max_tokens` padded tokens
/// (always at least one), ending where padding would waste more than a
/// quarter of a sequence (on a CPU the cost is about the padded token count).
pub(super) fn group_len(lengths: impl Iterator<Item = usize>, max_batch: usize, max_tokens: usize) -> usize {
    let mut n = 0;
    let mut longest = 0;
    for len in lengths {
        if n == 0 {
            longest = len;
        } else if n + 1 > max_batch.max(1) || (n + 1) * longest > max_tokens || len * 4 < longest * 3 {
            break;
        }
        n += 1;
    }
    n
}

/// The windows' vectors of some texts, summed per text until all are in.
pub(super) struct Sums {
    sums: Vec<Vec<f32>>,
    windows: Vec<usize>,
}

impl Sums {
    pub(super) fn new(texts: usize) -> Sums {
        Sums { sums: vec![vec![0.0f32; DIMENSIONS]; texts], windows: vec![0; texts] }
    }

    pub(super) fn add(&mut self, text: usize, v: &[f32]) {
        self.sums[text].iter_mut().zip(v).for_each(|(s, x)| *s += x);
        self.windows[text] += 1;
    }

    /// One unit vector per text: the normalised mean of its windows.
    pub(super) fn finish(self) -> Vec<Vec<f32>> {
        let mut sums = self.sums;
        for (sum, n) in sums.iter_mut().zip(self.windows) {
            // One window: already unit length, keep it bit for bit.
            if n > 1 {
                normalize(sum);
            }
        }
        sums
    }
}

/// The token windows a text is embedded as: the whole text when it fits,
/// otherwise full windows overlapping by [`CHUNK_OVERLAP`], the last one ending
/// at the text's end. An empty text is one empty window (`[CLS] [SEP]`).
fn windows(ids: &[u32]) -> Vec<&[u32]> {
    let size = MAX_TOKENS - 2;
    if ids.len() <= size {
        return vec![ids];
    }
    let stride = size - CHUNK_OVERLAP;
    let mut out: Vec<&[u32]> = (0..ids.len() - size).step_by(stride).map(|start| &ids[start..start + size]).collect();
    out.push(&ids[ids.len() - size..]);
    out
}

/// Pins the threads candle starts on its own to `threads`.
///
/// Besides the rayon pool [`LocalEmbedder`] runs it in, candle 0.11 keeps a
/// global pool of spinning threads for element-wise operations, sized once from
/// `CANDLE_NUM_THREADS` (else `RAYON_NUM_THREADS`, else the number of physical
/// cores), and splits each matrix product into `RAYON_NUM_THREADS` parts. Left
/// alone on a 2-core machine, an embedder configured for 1 thread keeps a
/// second core busy. This sets both variables unless the operator already did.
///
/// # Safety
///
/// It writes the process environment: call it while the process has a single
/// thread, in `main` before the async runtime is built (see
/// `std::env::set_var`).
pub unsafe fn pin_candle_threads(threads: usize) {
    for var in ["CANDLE_NUM_THREADS", "RAYON_NUM_THREADS"] {
        if std::env::var_os(var).is_none() {
            // SAFETY: the caller guarantees no other thread reads or writes the environment.
            unsafe { std::env::set_var(var, threads.to_string()) };
        }
    }
}

/// [`MiniLm`] behind its work queue (`queue.rs`) and two worker threads,
/// each with its own copy of the model: one embeds only queries, the other
/// writes and background work. A search therefore never waits for a write's
/// forward pass to end; the two compete for cores only when both are busy.
pub struct LocalEmbedder {
    /// To the query worker. Dropping the embedder closes both channels, and
    /// each worker exits once its current step is done.
    queries: mpsc::Sender<Job>,
    /// To the write worker.
    writes: mpsc::Sender<Job>,
    /// What is queued: callers are admitted or refused against it.
    pub(super) load: Arc<Load>,
    /// Most bytes of write text queued (a job is admitted into an empty queue whatever its size).
    max_queued_write_bytes: usize,
    /// Most queries queued.
    max_queued_queries: usize,
    model_id: &'static str,
}

impl LocalEmbedder {
    /// Loads the model (an error names `scripts/fetch-model.sh`) and starts the workers.
    pub fn new(config: &LocalConfig) -> anyhow::Result<Self> {
        anyhow::ensure!(config.threads > 0, "embedding.local.threads must be greater than 0");
        anyhow::ensure!(config.max_batch > 0, "embedding.local.max_batch must be greater than 0");
        if config.runtime == LocalRuntime::Candle
            && std::env::var("CANDLE_NUM_THREADS").ok() != Some(config.threads.to_string())
        {
            tracing::warn!(
                threads = config.threads,
                "CANDLE_NUM_THREADS is not embedding.local.threads: candle sizes its element-wise thread pool \
                 from it (else from the core count); set it, and RAYON_NUM_THREADS, to pin the embedder's threads"
            );
        }
        let settings = Settings {
            window: Duration::from_millis(config.batch_window_ms),
            max_batch: config.max_batch,
            write_step_tokens: config.write_step_tokens.max(1),
        };
        let load = Arc::new(Load::default());
        let query_products = if config.int8_queries { Products::Int8 } else { Products::F32 };
        let (queries, model_id) = start_worker(config, "query", query_products, settings, load.clone())?;
        let (writes, _) = start_worker(config, "write", Products::F32, settings, load.clone())?;
        Ok(Self {
            queries,
            writes,
            load,
            max_queued_write_bytes: config.max_queued_write_bytes,
            max_queued_queries: config.max_queued_queries,
            model_id,
        })
    }

    /// Counts a job against the queue's bounds, or refuses it.
    fn admit(&self, texts: &[String], lane: Lane<'_>) -> Result<(Class, Held), EmbedError> {
        let busy = || EmbedError::Busy { retry_after_secs: 2 };
        match lane {
            Lane::Query => {
                if self.load.queries.fetch_add(1, Ordering::AcqRel) >= self.max_queued_queries {
                    self.load.queries.fetch_sub(1, Ordering::AcqRel);
                    return Err(busy());
                }
                Ok((Class::Query, Held::Query))
            }
            Lane::Write { tenant } => {
                let bytes: usize = texts.iter().map(String::len).sum();
                let before = self.load.write_bytes.fetch_add(bytes, Ordering::AcqRel);
                if before > 0 && before + bytes > self.max_queued_write_bytes {
                    self.load.write_bytes.fetch_sub(bytes, Ordering::AcqRel);
                    return Err(busy());
                }
                Ok((Class::Write(tenant.to_string()), Held::WriteBytes(bytes)))
            }
            Lane::Background => Ok((Class::Background, Held::Nothing)),
        }
    }
}

/// Loads a copy of the model and starts a worker thread (`engram-embed-{name}`)
/// with `config.threads` threads of its own; returns its channel.
fn start_worker(
    config: &LocalConfig,
    name: &str,
    products: Products,
    settings: Settings,
    load: Arc<Load>,
) -> anyhow::Result<(mpsc::Sender<Job>, &'static str)> {
    let dir = PathBuf::from(&config.model_dir);
    let model = MiniLm::load_with(&dir, config.runtime, config.threads, products).with_context(|| {
        format!("loading the local embedding model from {} (embedding.local.model_dir)", dir.display())
    })?;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(config.threads)
        .thread_name({
            let name = name.to_string();
            move |i| format!("engram-embed-{name}-{i}")
        })
        .build()
        .context("starting the embedding threads")?;
    let (jobs, rx) = mpsc::channel();
    let model_id = model.model_id();
    std::thread::Builder::new()
        .name(format!("engram-embed-{name}"))
        .spawn(move || worker(&model, &pool, &rx, settings, load))
        .context("starting the embedding worker")?;
    Ok((jobs, model_id))
}

#[async_trait]
impl Embedder for LocalEmbedder {
    fn model_id(&self) -> &str {
        self.model_id
    }

    fn dimensions(&self) -> usize {
        DIMENSIONS
    }

    async fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
        self.embed_in(texts, Lane::Query).await
    }

    async fn embed_in(&self, texts: &[String], lane: Lane<'_>) -> Result<Vec<Vec<f32>>, EmbedError> {
        if texts.is_empty() {
            return Ok(Vec::new());
        }
        let (class, held) = self.admit(texts, lane)?;
        let (reply, answer) = oneshot::channel();
        let stopped = || EmbedError::Unavailable("the local embedding worker has stopped".into());
        let worker = if class == Class::Query { &self.queries } else { &self.writes };
        if let Err(mpsc::SendError(job)) = worker.send(Job { texts: texts.to_vec(), class, reply, held }) {
            self.load.release(job.held);
            return Err(stopped());
        }
        // Dropping this future (a cancelled request) closes `answer`: the
        // worker then drops the job before its next slice.
        answer.await.map_err(|_| stopped())?
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    pub(in crate::embed) fn model_dir() -> PathBuf {
        let dir = std::env::var("ENGRAM_MODEL_DIR").unwrap_or_else(|_| LocalConfig::default().model_dir);
        let dir = PathBuf::from(dir);
        // Relative paths are the repository's, wherever cargo runs the test from.
        let dir = if dir.is_relative() { Path::new(env!("CARGO_MANIFEST_DIR")).join(dir) } else { dir };
        assert!(
            dir.join("model.safetensors").is_file(),
            "no local embedding model in {}: run scripts/fetch-model.sh {} (scripts/test.sh does it and sets \
             ENGRAM_MODEL_DIR)",
            dir.display(),
            dir.display()
        );
        dir
    }

    fn embedder(runtime: LocalRuntime) -> LocalEmbedder {
        let config =
            LocalConfig { model_dir: model_dir().to_string_lossy().into_owned(), runtime, ..LocalConfig::default() };
        LocalEmbedder::new(&config).expect("the model loads")
    }

    const RUNTIMES: [LocalRuntime; 2] = [LocalRuntime::OnnxInt8, LocalRuntime::Candle];

    fn cosine(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(x, y)| x * y).sum()
    }

    fn strings(texts: &[&str]) -> Vec<String> {
        texts.iter().map(|t| t.to_string()).collect()
    }

    #[test]
    fn long_texts_are_cut_into_full_overlapping_windows() {
        let ids: Vec<u32> = (0..600).collect();
        let w = windows(&ids);
        assert_eq!(w.iter().map(|w| (w[0], w.len())).collect::<Vec<_>>(), [(0, 254), (222, 254), (346, 254)]);
        assert_eq!(*w.last().unwrap().last().unwrap(), 599);
        assert_eq!(windows(&ids[..254]).len(), 1);
        assert_eq!(windows(&ids[..255]).len(), 2);
        assert_eq!(windows(&[]), [&[] as &[u32]]);
    }

    #[tokio::test]
    async fn paraphrases_score_the_reference_cosine() {
        // candle: checked against a NumPy forward pass of the same weights;
        // int8: against the onnxruntime Python package on the same file.
        for (runtime, id, reference) in [
            (LocalRuntime::Candle, "all-MiniLM-L6-v2", 0.7012),
            (LocalRuntime::OnnxInt8, "all-MiniLM-L6-v2-int8", 0.7028),
        ] {
            let e = embedder(runtime);
            assert_eq!((e.model_id(), e.dimensions()), (id, 384));
            // As stored memories are embedded (the query worker's products are tested below).
            let v = e
                .embed_in(&strings(&["The user prefers dark mode", "User likes dark themes"]), Lane::Background)
                .await
                .unwrap();
            assert_eq!(v[0].len(), 384);
            assert!((cosine(&v[0], &v[0]) - 1.0).abs() < 1e-5);
            let c = cosine(&v[0], &v[1]);
            assert!((c - reference).abs() < 0.0005, "{runtime:?}: cosine {c}");
        }
    }

    #[tokio::test]
    async fn int8_vectors_stay_close_to_the_f32_ones() {
        let texts = strings(&[
            "The user prefers dark mode",
            "Flight to Lisbon booked for the 3rd of May, aisle seat.",
            "Vitamin D supplementation did not reduce the risk of fractures in older adults.",
            "ok",
        ]);
        let int8 = embedder(LocalRuntime::OnnxInt8).embed_in(&texts, Lane::Background).await.unwrap();
        let f32s = embedder(LocalRuntime::Candle).embed_in(&texts, Lane::Background).await.unwrap();
        for (i, (a, b)) in int8.iter().zip(&f32s).enumerate() {
            let c = cosine(a, b);
            assert!(c > 0.97, "text {i}: cosine {c} between the int8 and f32 vectors");
        }
    }

    #[test]
    fn int8_products_keep_the_reference_cosine_and_stay_close_to_f32() {
        let dir = model_dir();
        let int8 =
            MiniLm::load_with(&dir, LocalRuntime::OnnxInt8, 1, Products::Int8).expect("the rewritten graph loads");
        let f32s = MiniLm::load(&dir, LocalRuntime::OnnxInt8, 1).unwrap();
        // ONNX Runtime multiplies u8 activations by s8 weights with VNNI's
        // dot product where the CPU has it; elsewhere (AVX2, AVX-512 without
        // VNNI) with VPMADDUBSW, whose 16-bit pair sums saturate on some
        // products, as its documentation warns, so the two give different
        // vectors. With VNNI: the onnxruntime Python package on the same
        // rewritten graph (f32 products: 0.7028); without: this test on an
        // AMD EPYC with AVX2 only. The closeness to f32 below holds on both.
        #[cfg(target_arch = "x86_64")]
        let vnni = std::arch::is_x86_feature_detected!("avx512vnni") || std::arch::is_x86_feature_detected!("avxvnni");
        #[cfg(not(target_arch = "x86_64"))]
        let vnni = false;
        let (reference, tolerance) = if vnni { (0.7019, 0.0005) } else { (0.6943, 0.002) };
        let v = int8.embed(&["The user prefers dark mode", "User likes dark themes"], 32).unwrap();
        let c = cosine(&v[0], &v[1]);
        assert!((c - reference).abs() < tolerance, "cosine {c} (VNNI: {vnni})");
        let texts = [
            "The user prefers dark mode",
            "Flight to Lisbon booked for the 3rd of May, aisle seat.",
            "Vitamin D supplementation did not reduce the risk of fractures in older adults.",
            "ok",
            "What does Alice do for a living?",
        ];
        let (a, b) = (int8.embed(&texts, 32).unwrap(), f32s.embed(&texts, 32).unwrap());
        // The rounding weighs most on the shortest texts ("ok": 0.977).
        let cosines: Vec<f32> = a.iter().zip(&b).map(|(a, b)| cosine(a, b)).collect();
        assert!(cosines.iter().all(|&c| c > 0.97 && c < 0.99999), "cosines {cosines:?}");
        assert!(cosines.iter().sum::<f32>() / cosines.len() as f32 > 0.985, "cosines {cosines:?}");
        // One pass per sequence: a text's vector does not depend on its batch.
        let alone = int8.embed(&texts[1..2], 32).unwrap();
        assert_eq!(alone[0], a[1]);
    }

    #[tokio::test]
    async fn queries_take_int8_products_and_writes_f32_unless_configured() {
        let text = strings(&["Alice works night shifts as a nurse."]);
        let write = Lane::Write { tenant: "t" };
        for int8_queries in [true, false] {
            let config = LocalConfig {
                model_dir: model_dir().to_string_lossy().into_owned(),
                int8_queries,
                ..LocalConfig::default()
            };
            let e = LocalEmbedder::new(&config).unwrap();
            let q = e.embed_in(&text, Lane::Query).await.unwrap().remove(0);
            let w = e.embed_in(&text, write).await.unwrap().remove(0);
            let background = e.embed_in(&text, Lane::Background).await.unwrap().remove(0);
            assert_eq!(w, background, "every stored vector comes from the f32 products");
            let c = cosine(&q, &w);
            if int8_queries {
                assert!(c > 0.98 && c < 0.99999, "cosine {c}");
            } else {
                assert_eq!(q, w);
            }
        }
    }

    #[tokio::test]
    async fn a_batch_gives_the_same_vectors_as_single_calls() {
        for runtime in RUNTIMES {
            a_batch_gives_the_same_vectors_as_single_calls_on(runtime).await;
        }
    }

    async fn a_batch_gives_the_same_vectors_as_single_calls_on(runtime: LocalRuntime) {
        let e = embedder(runtime);
        let texts = strings(&[
            "The user prefers dark mode",
            "Flight to Lisbon booked for the 3rd of May, aisle seat.",
            "ok",
            "",
            "The quarterly report is due on Friday; remind the team on Wednesday afternoon.",
        ]);
        let batch = e.embed(&texts).await.unwrap();
        // Concurrent single calls are batched together by the worker, too.
        let singles = futures::future::join_all(texts.iter().map(|t| e.embed(std::slice::from_ref(t)))).await;
        for (i, (b, s)) in batch.iter().zip(singles).enumerate() {
            let s = &s.unwrap()[0];
            let diff = b.iter().zip(s).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
            assert!(diff < 1e-5, "{runtime:?}: text {i} differs by {diff}");
        }
        // And one at a time, with nothing to batch with.
        let alone = &e.embed(&texts[1..2]).await.unwrap()[0];
        let diff = batch[1].iter().zip(alone).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
        assert!(diff < 1e-5, "{runtime:?}: differs by {diff}");
    }

    #[tokio::test]
    async fn text_longer_than_the_window_is_embedded_whole() {
        for runtime in RUNTIMES {
            text_longer_than_the_window_is_embedded_whole_on(runtime).await;
        }
    }

    async fn text_longer_than_the_window_is_embedded_whole_on(runtime: LocalRuntime) {
        let e = embedder(runtime);
        let vitamin = "The patient was treated with a daily dose of vitamin D for twelve weeks. ";
        let cat = "Afterwards the user adopted a small grey cat named Miso from the shelter. ";
        // About 500 tokens on vitamin D, then 500 on the cat: four windows.
        let long = format!("{}{}", vitamin.repeat(30), cat.repeat(30));
        let v = e.embed(&strings(&[&long, vitamin, cat])).await.unwrap();
        assert!((cosine(&v[0], &v[0]) - 1.0).abs() < 1e-5);
        let (to_vitamin, to_cat) = (cosine(&v[0], &v[1]), cosine(&v[0], &v[2]));
        eprintln!("{runtime:?}: long text: cosine {to_vitamin} to its first half, {to_cat} to its second half");
        // Cut at 256 tokens the text would be about vitamin D only; the whole text is about both.
        assert!(to_vitamin > 0.5 && to_cat > 0.5, "{to_vitamin} {to_cat}");
        let cut = &e.embed(&strings(&[&vitamin.repeat(30)])).await.unwrap()[0];
        assert!(cosine(cut, &v[2]) < to_cat - 0.2, "{} vs {to_cat}", cosine(cut, &v[2]));
    }

    #[test]
    fn a_missing_model_names_the_fetch_script() {
        let config = LocalConfig { model_dir: "/nonexistent/engram-model".into(), ..LocalConfig::default() };
        let err = format!("{:#}", LocalEmbedder::new(&config).err().expect("no model there"));
        assert!(err.contains("scripts/fetch-model.sh"), "{err}");
        assert!(err.contains("embedding.local.model_dir"), "{err}");
    }

    #[test]
    fn a_corrupt_model_names_the_fetch_script() {
        let src = model_dir();
        for (runtime, corrupt) in [
            (LocalRuntime::Candle, "model.safetensors"),
            (LocalRuntime::OnnxInt8, "model-int8.onnx"),
            (LocalRuntime::OnnxInt8, "libonnxruntime.so.1.31.1"),
        ] {
            let dir = std::env::temp_dir().join(format!("engram-corrupt-model-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            for name in
                ["config.json", "tokenizer.json", "model.safetensors", "model-int8.onnx", "libonnxruntime.so.1.31.1"]
            {
                std::fs::copy(src.join(name), dir.join(name)).unwrap();
            }
            std::fs::write(dir.join(corrupt), b"not what was pinned").unwrap();
            let err = format!("{:#}", MiniLm::load(&dir, runtime, 1).err().expect("a corrupt file"));
            std::fs::remove_dir_all(&dir).unwrap();
            assert!(
                err.contains("corrupt") && err.contains(corrupt) && err.contains("scripts/fetch-model.sh"),
                "{err}"
            );
        }
    }
}

//! A deterministic step-level scheduler: up to `parallel` generations are active at once and
//! advanced round-robin, one decode step (or one prefill chunk) each per round, on one engine
//! thread. New requests join at round boundaries from a FIFO wait queue; a cancelled request
//! leaves at its next step (or straight from the queue), freeing its slot.
//!
//! Each round hands every active generation's forward pass to [`Backend::feed_many`] together,
//! so a backend that batches several sequences into one pass speeds all of them up with no
//! change here. Outputs never depend on the interleaving: each generation owns its sequence and
//! its sampler (keyed by its seed and absolute positions), and the backend contract makes logits
//! depend only on a sequence's own tokens.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;

use super::Backend;
use super::cache::{DEFAULT_CACHE_BYTES, ENTRIES_PER_SLOT, PromptCache};
use super::generate::{GenEvent, GenOutput, GenerateError, GenerateRequest, TokenDecoder};
use super::generation::{Generation, GenerationOptions, Next};

pub const DEFAULT_PARALLEL: usize = 4;
pub const DEFAULT_QUEUE: usize = 256;

#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// Generations advanced concurrently.
    pub parallel: usize,
    /// Requests allowed to wait for a slot; more are refused.
    pub queue: usize,
    /// Prompt-cache entries (0 turns the cache off).
    pub cache_entries: usize,
    /// Bytes the prompt-cache entries may hold together (0 turns the cache off).
    pub cache_bytes: usize,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            parallel: DEFAULT_PARALLEL,
            queue: DEFAULT_QUEUE,
            cache_entries: ENTRIES_PER_SLOT * DEFAULT_PARALLEL,
            cache_bytes: DEFAULT_CACHE_BYTES,
        }
    }
}

/// Live counts, readable from any thread (for `/metrics`).
#[derive(Debug, Default)]
pub struct SchedulerStats {
    /// Requests submitted and not yet admitted to a slot.
    pub waiting: AtomicUsize,
    /// Generations holding a slot.
    pub running: AtomicUsize,
    /// Prompt tokens still to feed, over the active generations.
    pub prefill_remaining: AtomicUsize,
    /// Prompt tokens fed so far, over the active generations still prefilling.
    pub prefill_done: AtomicUsize,
    /// Rounds run (one step of every active generation each).
    pub rounds: AtomicUsize,
    /// Prompt-cache entries and the bytes their sequences hold.
    pub cache_entries: AtomicUsize,
    pub cache_bytes: AtomicUsize,
    /// The backend's batched passes and the steps they carried ([`Backend::batched_passes`]).
    pub batched_passes: AtomicUsize,
    pub batched_steps: AtomicUsize,
}

pub type EventSink = Box<dyn FnMut(GenEvent) + Send>;
pub type DoneSink = Box<dyn FnOnce(Result<GenOutput, GenerateError>) + Send>;

/// One request handed to the scheduler.
pub struct Submission {
    pub request: GenerateRequest,
    pub options: GenerationOptions,
    pub decoder: Box<dyn TokenDecoder + Send>,
    /// Raised when the client goes away.
    pub cancel: Arc<AtomicBool>,
    pub on_event: EventSink,
    /// Called exactly once, with the output or the error.
    pub on_done: DoneSink,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SubmitError {
    #[error(
        "the server is busy: {running} requests are generating and {waiting} more are waiting (queue limit {capacity})"
    )]
    QueueFull {
        running: usize,
        waiting: usize,
        capacity: usize,
    },
    #[error("the scheduler has stopped")]
    Stopped,
}

/// Handle to the engine thread; dropping every handle stops it once its work is done.
pub struct Scheduler {
    sender: mpsc::Sender<Submission>,
    stats: Arc<SchedulerStats>,
    config: SchedulerConfig,
}

impl Scheduler {
    pub fn start(
        backend: Arc<dyn Backend>,
        config: SchedulerConfig,
        stats: Arc<SchedulerStats>,
    ) -> std::io::Result<Scheduler> {
        let (sender, receiver) = mpsc::channel();
        let mut engine = EngineLoop {
            backend,
            parallel: config.parallel.max(1),
            cache: PromptCache::new(config.cache_entries, config.cache_bytes),
            stats: stats.clone(),
            queue: VecDeque::new(),
            active: Vec::new(),
        };
        std::thread::Builder::new()
            .name("strata-scheduler".into())
            .spawn(move || engine.run(receiver))?;
        Ok(Scheduler {
            sender,
            stats,
            config,
        })
    }

    pub fn stats(&self) -> &Arc<SchedulerStats> {
        &self.stats
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    /// Queue a request (FIFO). Refused when the wait queue is full and no slot is free.
    pub fn submit(&self, submission: Submission) -> Result<(), SubmitError> {
        let capacity = self.config.queue;
        let running = self.stats.running.load(Ordering::SeqCst);
        let free_slots = self.config.parallel.max(1).saturating_sub(running);
        let waiting = self.stats.waiting.fetch_add(1, Ordering::SeqCst);
        if waiting >= capacity + free_slots {
            self.stats.waiting.fetch_sub(1, Ordering::SeqCst);
            return Err(SubmitError::QueueFull {
                running,
                waiting,
                capacity,
            });
        }
        self.sender.send(submission).map_err(|_| {
            self.stats.waiting.fetch_sub(1, Ordering::SeqCst);
            SubmitError::Stopped
        })
    }
}

struct Active {
    generation: Generation<Box<dyn TokenDecoder + Send>>,
    cancel: Arc<AtomicBool>,
    on_event: EventSink,
    on_done: Option<DoneSink>,
    /// Set when this round's `advance` finished the generation.
    result: Option<Result<GenOutput, GenerateError>>,
}

struct EngineLoop {
    backend: Arc<dyn Backend>,
    parallel: usize,
    cache: PromptCache,
    stats: Arc<SchedulerStats>,
    queue: VecDeque<Submission>,
    active: Vec<Active>,
}

impl EngineLoop {
    fn run(&mut self, receiver: mpsc::Receiver<Submission>) {
        loop {
            if self.active.is_empty() && self.queue.is_empty() {
                match receiver.recv() {
                    Ok(s) => self.queue.push_back(s),
                    Err(_) => return,
                }
            }
            while let Ok(s) = receiver.try_recv() {
                self.queue.push_back(s);
            }
            self.drop_cancelled_waiting();
            self.admit();
            self.round();
            self.publish_stats();
        }
    }

    /// Requests whose client left while waiting end now, without taking a slot.
    fn drop_cancelled_waiting(&mut self) {
        let (cancelled, kept): (Vec<Submission>, Vec<Submission>) = self
            .queue
            .drain(..)
            .partition(|s| s.cancel.load(Ordering::Relaxed));
        self.queue = kept.into();
        for s in cancelled {
            self.stats.waiting.fetch_sub(1, Ordering::SeqCst);
            (s.on_done)(Err(GenerateError::Cancelled));
        }
    }

    /// Fill free slots from the front of the queue.
    fn admit(&mut self) {
        while self.active.len() < self.parallel {
            let Some(s) = self.queue.pop_front() else {
                break;
            };
            self.stats.waiting.fetch_sub(1, Ordering::SeqCst);
            match Generation::start(
                &self.backend,
                &mut self.cache,
                s.request,
                s.options,
                s.decoder,
            ) {
                Ok(generation) => self.active.push(Active {
                    generation,
                    cancel: s.cancel,
                    on_event: s.on_event,
                    on_done: Some(s.on_done),
                    result: None,
                }),
                Err(e) => (s.on_done)(Err(e)),
            }
        }
        self.stats
            .running
            .store(self.active.len(), Ordering::SeqCst);
    }

    /// One step of every active generation: host work, one batched forward, absorb.
    fn round(&mut self) {
        let cache = &mut self.cache;
        for a in &mut self.active {
            let cancelled = a.cancel.load(Ordering::Relaxed);
            match a.generation.advance(cancelled, cache, &mut *a.on_event) {
                Ok(Next::Feed) if !a.generation.can_feed() => {
                    let e =
                        super::EngineError::Other("a generation to feed has no sequence".into());
                    a.result = Some(Err(e.into()));
                }
                Ok(Next::Feed) => {}
                Ok(Next::Finished(output)) => a.result = Some(Ok(output)),
                Err(e) => a.result = Some(Err(e)),
            }
        }
        // Results come back in batch order: every generation left hands over an item.
        let mut feeding: Vec<&mut Active> = self
            .active
            .iter_mut()
            .filter(|a| a.result.is_none())
            .collect();
        let mut batch: Vec<_> = feeding
            .iter_mut()
            .filter_map(|a| a.generation.feed_item())
            .collect();
        let results = self.backend.feed_many(&mut batch);
        drop(batch);
        for (a, fed) in feeding.into_iter().zip(results) {
            if let Err(e) = a.generation.absorb(fed, cache, &mut *a.on_event) {
                a.result = Some(Err(e));
            }
        }
        self.retire_finished();
        self.stats.rounds.fetch_add(1, Ordering::Relaxed);
        let (passes, steps) = self.backend.batched_passes();
        self.stats.batched_passes.store(passes, Ordering::Relaxed);
        self.stats.batched_steps.store(steps, Ordering::Relaxed);
    }

    /// Report finished generations and free their slots (order of admission is kept).
    fn retire_finished(&mut self) {
        let mut i = 0;
        while i < self.active.len() {
            if self.active[i].result.is_none() {
                i += 1;
                continue;
            }
            let mut done = self.active.remove(i);
            if let (Some(result), Some(on_done)) = (done.result.take(), done.on_done.take()) {
                if result.is_err() {
                    // A failed sequence may have left shared state suspect: start clean.
                    self.cache.clear();
                }
                on_done(result);
            }
        }
        self.stats
            .running
            .store(self.active.len(), Ordering::SeqCst);
    }

    fn publish_stats(&self) {
        let (done, remaining) = self
            .active
            .iter()
            .map(|a| a.generation.prompt_progress())
            .filter(|(done, total)| done < total)
            .fold((0, 0), |(d, r), (done, total)| (d + done, r + total - done));
        self.stats.prefill_done.store(done, Ordering::Relaxed);
        self.stats
            .cache_entries
            .store(self.cache.len(), Ordering::Relaxed);
        self.stats
            .cache_bytes
            .store(self.cache.bytes(), Ordering::Relaxed);
        self.stats
            .prefill_remaining
            .store(remaining, Ordering::Relaxed);
    }
}

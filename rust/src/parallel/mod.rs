//! Tensor parallelism (Megatron-style) inside one process: a model split into `N` shards that
//! run one forward together, each holding a slice of the weights and of the KV cache.
//!
//! - [`plan`]: which query heads, KV heads, FFN columns and vocabulary rows each shard holds,
//!   and why a model cannot be split `N` ways ([`crate::FakError::Shard`]);
//! - [`slice`]: a shard's slice of a GGUF tensor, in its block format (never dequantized);
//! - [`comm`]: the [`Communicator`] trait (all-reduce, gather) and its in-process
//!   implementation for shards on threads ([`LocalComm`]);
//! - [`sharded`]: [`ShardedModel`], the shards of one model with their KV caches, buffers, pools
//!   and communicators, and its forward (the engine's `tensor_parallel = N`).
//!
//! The forward itself is [`crate::model::Model::forward_tp`], the one forward of every model
//! with its two all-reduces per layer and the logits gather. Design, numbers and what the
//! CUDA/NCCL side still needs: docs/tensor-parallel.md.

pub mod comm;
pub mod plan;
pub mod sharded;
pub mod slice;

pub use comm::{Communicator, LocalComm};
pub use plan::{ShardPlan, ShardSpec};
pub use sharded::ShardedModel;

//! The ops of the [`crate::backend::Backend`] trait on the GPU, one file per kernel family of
//! `rust/kernels/` (launch geometry, kernel choice, the q8_1 bookkeeping of activation buffers).

mod attention;
mod deltanet;
mod elementwise;
mod embed;
mod kv;
mod matmul;
pub mod matmul_plan;
mod matmul_table;
mod moe;
mod moe_host;
mod norm;
mod rope;
mod sampling;

pub(crate) use deltanet::{gdn_chunk_min_rows, GdnScratch};
pub(crate) use matmul::MM_COUNTERS;
pub(crate) use moe::MoeScratch;
pub(crate) use moe_host::{upload_min_rows_from_env, ExpertStaging, EXPERT_UPLOAD_BYTES};

//! avx512 kernels (filled in by the SIMD work; until then every type runs the scalar kernel).

use super::Plan;
use crate::quant::GgmlType;

pub(super) fn plan(_t: GgmlType) -> Option<Plan> {
    None
}

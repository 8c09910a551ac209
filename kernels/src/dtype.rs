//! Element types of tensors and their byte encodings.
//!
//! A `crate::tensor::Tensor` stores f32, f16 or bf16 elements; every kernel, on the GPU
//! (`kernels/cuda/common.cuh`) and on the CPU (`crate::cpu`), loads them as f32, computes in
//! f32 and stores in the output's type. This module converts between host `f32` slices and the
//! stored bytes, with the `half` crate's round-to-nearest-even conversions, which the CUDA
//! helpers reproduce bit for bit.

use std::fmt;

use half::{bf16, f16};

/// The element type of a tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// IEEE single precision.
    F32,
    /// IEEE half precision.
    F16,
    /// bfloat16: f32's exponent with an 8-bit significand.
    BF16,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
        }
    }

    /// The lower-case name (`"f32"`, `"f16"`, `"bf16"`).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
        }
    }

    /// The code the CUDA kernels take for this type (`VS_F32`, `VS_F16`, `VS_BF16`).
    pub fn code(self) -> i32 {
        match self {
            DType::F32 => 0,
            DType::F16 => 1,
            DType::BF16 => 2,
        }
    }

    /// `value` after a round trip through this type.
    pub fn round(self, value: f32) -> f32 {
        match self {
            DType::F32 => value,
            DType::F16 => f16::from_f32(value).to_f32(),
            DType::BF16 => bf16::from_f32(value).to_f32(),
        }
    }

    /// Encodes `values` as little-endian elements of this type.
    pub fn encode(self, values: &[f32]) -> Vec<u8> {
        let mut out = Vec::with_capacity(values.len() * self.size());
        match self {
            DType::F32 => values
                .iter()
                .for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
            DType::F16 => values
                .iter()
                .for_each(|v| out.extend_from_slice(&f16::from_f32(*v).to_bits().to_le_bytes())),
            DType::BF16 => values
                .iter()
                .for_each(|v| out.extend_from_slice(&bf16::from_f32(*v).to_bits().to_le_bytes())),
        }
        out
    }

    /// Decodes little-endian elements of this type into f32 (a trailing partial element is
    /// ignored).
    pub fn decode(self, bytes: &[u8]) -> Vec<f32> {
        match self {
            DType::F32 => bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            DType::F16 => bytes
                .chunks_exact(2)
                .map(|c| f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
                .collect(),
            DType::BF16 => bytes
                .chunks_exact(2)
                .map(|c| bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
                .collect(),
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodings_round_trip_and_round_to_nearest_even() {
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let values = [0.0, -1.5, 2.0, 65504.0, 1e-3];
            let back = dtype.decode(&dtype.encode(&values));
            assert_eq!(back.len(), values.len());
            for (v, b) in values.iter().zip(&back) {
                assert_eq!(dtype.round(*v), *b, "{dtype} {v}");
            }
            assert_eq!(dtype.encode(&values).len(), values.len() * dtype.size());
        }
        // 1 + 2^-8 is exactly between two bf16 values and rounds to the even one, 1.0.
        assert_eq!(DType::BF16.round(1.0 + 1.0 / 256.0), 1.0);
        assert_eq!(DType::F16.round(1.0 + 1.0 / 2048.0), 1.0);
        assert!(DType::F16.round(f32::NAN).is_nan());
        assert_eq!(DType::F16.round(1e6), f32::INFINITY);
    }
}

//! Pickle reader (placeholder, being written).

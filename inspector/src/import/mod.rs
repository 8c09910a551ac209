//! Importers (placeholder, being written).

//! gyre-model (stub while being written).

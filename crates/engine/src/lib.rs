//! gyre-engine (stub while being written).

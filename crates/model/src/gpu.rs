//! The `gpu` feature: a CUDA presence probe through cudarc's dynamic loading.
//!
//! It compiles without a CUDA toolkit or driver (cudarc dlopens `libcuda` at run time), so
//! `cargo build --features gpu` works on any machine. The model itself still runs on the CPU;
//! a CUDA path for it is future work (candle's own `cuda` feature needs nvcc at build time).
//! cudarc panics when the library is absent, so [`cuda_devices_count`] probes before any call.

/// Whether a CUDA driver library can be loaded and initialised here; returns the device count.
pub fn cuda_devices_count() -> Option<usize> {
    // SAFETY: `is_culib_present` only tries to dlopen the driver library and reports whether
    // that worked; it touches no CUDA state. It is `unsafe` because loading a library runs its
    // initialisers, which is exactly the probe we want before any other cudarc call.
    #[allow(unsafe_code)]
    let present = unsafe { cudarc::driver::sys::is_culib_present() };
    if !present {
        return None;
    }
    cudarc::driver::result::init().ok()?;
    cudarc::driver::result::device::get_count()
        .ok()
        .map(|count| count as usize)
}

/// Whether CUDA is usable on this machine.
pub fn cuda_available() -> bool {
    cuda_devices_count().is_some_and(|count| count > 0)
}

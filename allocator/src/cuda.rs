//! The CUDA backend: [`Backend`] on a real GPU through the driver API, loaded at run time.
//!
//! [`CudaBackend`] is the thin twin of `crate::SimDevice`: `crate::CachingAllocator` asks it for raw
//! segments (`cuMemAlloc`/`cuMemFree`), streams, events, copies and memsets, and for the
//! virtual-memory API (`cuMemAddressReserve`, `cuMemCreate`, `cuMemMap`, `cuMemSetAccess`,
//! `cuMemUnmap`, `cuMemRelease`) behind expandable segments. It adds no policy of its own.
//!
//! cudarc is built with dynamic loading, so this crate links and tests on machines with no CUDA
//! at all: [`probe`] checks that the driver library can be opened *before* any driver call
//! (cudarc panics on a missing library), and guards the first calls with `catch_unwind` (cudarc
//! also panics on a missing symbol), turning every failure into a one-line reason. `crate::any`
//! uses that reason to fall back to the simulated device, and its `doctor` report prints it.
//! The kernels crate reaches the context and raw streams through [`CudaBackend::context`] and
//! [`CudaBackend::raw_stream`] to launch its NVRTC-compiled kernels on the same streams.

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use cudarc::driver::result::{self, DriverError};
use cudarc::driver::{sys, CudaContext};
use parking_lot::Mutex;
use rustc_hash::FxHashMap;

use vramscope_caching::{Backend, BackendError, EventId, MemInfo, StreamId};

/// A raw stream handle that may cross threads.
struct RawStream(sys::CUstream);

// SAFETY: a CUstream is an opaque driver handle; the driver allows it to be used from any thread
// whose current context is the stream's context, which every method here ensures by binding the
// context first. The handle is only destroyed in `CudaInner::drop`, after all users are gone.
unsafe impl Send for RawStream {}

/// A raw event handle that may cross threads.
struct RawEvent(sys::CUevent);

// SAFETY: as for `RawStream`: an opaque driver handle, used only with its context bound and
// destroyed once, under the state lock or in `CudaInner::drop`.
unsafe impl Send for RawEvent {}

/// One physical page mapped into a reserved range.
struct MappedPage {
    handle: sys::CUmemGenericAllocationHandle,
}

/// The handles this backend owns, behind one lock.
#[derive(Default)]
struct CudaState {
    /// Created streams; `StreamId(i + 1)` is `streams[i]`, `StreamId(0)` the legacy default.
    streams: Vec<RawStream>,
    events: FxHashMap<u64, RawEvent>,
    next_event: u64,
    /// Live `cuMemAlloc` segments: address → size.
    segments: FxHashMap<u64, u64>,
    /// Reserved address ranges: address → size.
    reservations: BTreeMap<u64, u64>,
    /// Mapped pages (one granularity-sized physical allocation each), by address.
    pages: BTreeMap<u64, MappedPage>,
}

struct CudaInner {
    ctx: Arc<CudaContext>,
    ordinal: u32,
    name: String,
    total: u64,
    granularity: u64,
    compute_capability: (i32, i32),
    state: Mutex<CudaState>,
}

/// A CUDA device driven through the driver API. Cloning gives another handle to the same device.
#[derive(Clone)]
pub struct CudaBackend {
    inner: Arc<CudaInner>,
}

pub use crate::driver_info::{CudaDeviceInfo, DriverInfo};

/// Turns a driver error into the backend's error type, naming the call that failed.
fn driver_error(call: &str, e: DriverError) -> BackendError {
    BackendError::Driver {
        message: format!("{call}: {}", describe(e)),
    }
}

/// The driver's name and description of an error code, without panicking.
fn describe(e: DriverError) -> String {
    let name = e
        .error_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|_| format!("{:?}", e.0));
    match e.error_string() {
        Ok(text) => format!("{name} ({})", text.to_string_lossy()),
        Err(_) => name,
    }
}

/// Runs `f`, turning a panic inside cudarc (missing library or symbol) into an error string.
fn guarded<T>(what: &str, f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(result) => result,
        Err(panic) => {
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "unknown panic".to_string());
            Err(format!("{what} panicked: {message}"))
        }
    }
}

/// Whether the CUDA driver library (`libcuda.so`, `nvcuda.dll`) can be opened.
pub fn driver_library_present() -> bool {
    // SAFETY: `is_culib_present` only tries to open the library by its usual names and closes it
    // again; opening libcuda runs no user-visible initialization.
    catch_unwind(|| unsafe { sys::is_culib_present() }).unwrap_or(false)
}

/// Whether the NVRTC library (`libnvrtc.so`) can be opened, and its version when it can.
pub fn nvrtc_version() -> Result<(u32, u32), String> {
    // SAFETY: as for `driver_library_present`: the probe opens and closes the library.
    let present =
        catch_unwind(|| unsafe { cudarc::nvrtc::sys::is_culib_present() }).unwrap_or(false);
    if !present {
        return Err("NVRTC library (libnvrtc.so) not found".to_string());
    }
    guarded("nvrtcVersion", || {
        let (mut major, mut minor) = (0, 0);
        // SAFETY: the library is present (checked above); `nvrtcVersion` writes two ints through
        // the valid pointers it is given.
        let status = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
        if status == cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
            Ok((major as u32, minor as u32))
        } else {
            Err(format!("nvrtcVersion failed: {status:?}"))
        }
    })
}

/// Loads the driver, initializes it and lists its devices, or says in one line why it cannot.
///
/// Never panics: a missing library is detected before cudarc is asked to load it, and panics
/// from cudarc (a driver too old to have a symbol) are caught.
pub fn probe() -> Result<DriverInfo, String> {
    if !driver_library_present() {
        return Err("the driver library libcuda.so was not found".to_string());
    }
    guarded("CUDA driver probe", || {
        result::init().map_err(|e| format!("cuInit failed: {}", describe(e)))?;
        let mut version = 0;
        // SAFETY: the driver is loaded and initialized; the call writes one int.
        unsafe { sys::cuDriverGetVersion(&mut version) }
            .result()
            .map_err(|e| format!("cuDriverGetVersion failed: {}", describe(e)))?;
        let count = result::device::get_count()
            .map_err(|e| format!("cuDeviceGetCount failed: {}", describe(e)))?;
        let mut devices = Vec::new();
        for ordinal in 0..count {
            let dev = result::device::get(ordinal)
                .map_err(|e| format!("cuDeviceGet({ordinal}) failed: {}", describe(e)))?;
            let name = result::device::get_name(dev).unwrap_or_else(|_| "unknown".to_string());
            // SAFETY: `dev` is a valid device handle from `cuDeviceGet`.
            let total = unsafe { result::device::total_mem(dev) }.unwrap_or(0) as u64;
            let attr = |a| {
                // SAFETY: `dev` is a valid device handle and `a` a valid attribute.
                unsafe { result::device::get_attribute(dev, a) }.unwrap_or(0)
            };
            let cc = (
                attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
                attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR),
            );
            devices.push(CudaDeviceInfo {
                ordinal: ordinal as u32,
                name,
                total_bytes: total,
                free_bytes: None,
                compute_capability: cc,
            });
        }
        Ok(DriverInfo {
            version: ((version / 1000) as u32, ((version % 1000) / 10) as u32),
            devices,
        })
    })
}

impl CudaBackend {
    /// Opens device `ordinal`: loads the driver, retains the primary context and reads the
    /// device's name, memory and virtual-memory granularity. Fails with a one-line reason.
    pub fn new(ordinal: u32) -> Result<CudaBackend, String> {
        let info = probe()?;
        let device = info
            .devices
            .iter()
            .find(|d| d.ordinal == ordinal)
            .cloned()
            .ok_or_else(|| match info.devices.len() {
                0 => "the CUDA driver loaded but reports no device".to_string(),
                n => format!("no CUDA device {ordinal} (the driver reports {n})"),
            })?;
        guarded("CUDA context creation", || {
            let ctx = CudaContext::new(ordinal as usize)
                .map_err(|e| format!("creating a context on device {ordinal}: {}", describe(e)))?;
            let granularity = vm_granularity_of(ordinal).unwrap_or(2 << 20);
            Ok(CudaBackend {
                inner: Arc::new(CudaInner {
                    ctx,
                    ordinal,
                    name: device.name.clone(),
                    total: device.total_bytes,
                    granularity,
                    compute_capability: device.compute_capability,
                    state: Mutex::new(CudaState {
                        next_event: 1,
                        ..CudaState::default()
                    }),
                }),
            })
        })
    }

    /// The driver context (the device's primary context), for launching kernels.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.inner.ctx
    }

    /// Compute capability (major, minor).
    pub fn compute_capability(&self) -> (i32, i32) {
        self.inner.compute_capability
    }

    /// The raw driver stream behind `stream` (null for the default stream), with the context
    /// bound to the calling thread so the caller can launch work on it at once.
    pub fn raw_stream(&self, stream: StreamId) -> Result<sys::CUstream, BackendError> {
        self.bind()?;
        self.stream_handle(&self.inner.state.lock(), stream)
    }

    /// Makes this device's context current on the calling thread.
    fn bind(&self) -> Result<(), BackendError> {
        self.inner
            .ctx
            .bind_to_thread()
            .map_err(|e| driver_error("cuCtxSetCurrent", e))
    }

    fn stream_handle(
        &self,
        state: &CudaState,
        stream: StreamId,
    ) -> Result<sys::CUstream, BackendError> {
        if stream == StreamId::DEFAULT {
            return Ok(result::stream::null());
        }
        state
            .streams
            .get(stream.0 as usize - 1)
            .map(|s| s.0)
            .ok_or(BackendError::InvalidHandle {
                kind: "stream",
                id: stream.0,
            })
    }

    fn event_handle(state: &CudaState, event: EventId) -> Result<sys::CUevent, BackendError> {
        state
            .events
            .get(&event.0)
            .map(|e| e.0)
            .ok_or(BackendError::InvalidHandle {
                kind: "event",
                id: event.0,
            })
    }

    fn out_of_memory(&self, requested: u64) -> BackendError {
        BackendError::OutOfMemory {
            requested,
            free: self.mem_info().free,
        }
    }

    fn allocation_prop(ordinal: u32) -> sys::CUmemAllocationProp {
        sys::CUmemAllocationProp {
            type_: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
            requestedHandleTypes: sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE,
            location: sys::CUmemLocation {
                type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: ordinal as i32,
            },
            win32HandleMetaData: std::ptr::null_mut(),
            allocFlags: sys::CUmemAllocationProp_st__bindgen_ty_1 {
                compressionType: 0,
                gpuDirectRDMACapable: 0,
                usage: 0,
                reserved: [0; 4],
            },
        }
    }

    /// Unmaps and releases the pages at `addrs` (already removed from the state).
    fn release_pages(pages: Vec<(u64, MappedPage)>, granularity: u64) -> Result<(), BackendError> {
        let mut first_error = None;
        for (addr, page) in pages {
            // SAFETY: `addr` is the start of a page this backend mapped with `cuMemMap` and has
            // not unmapped; the caller removed it from the state, so it is unmapped once.
            let unmapped = unsafe { sys::cuMemUnmap(addr, granularity as usize) }.result();
            // SAFETY: `page.handle` came from `cuMemCreate` and is released exactly once, here.
            let released = unsafe { sys::cuMemRelease(page.handle) }.result();
            if let Err(e) = unmapped.and(released) {
                first_error.get_or_insert(driver_error("cuMemUnmap/cuMemRelease", e));
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

/// The minimum page size of the virtual-memory API on device `ordinal`.
fn vm_granularity_of(ordinal: u32) -> Result<u64, DriverError> {
    let prop = CudaBackend::allocation_prop(ordinal);
    let mut granularity = 0usize;
    // SAFETY: `prop` is a fully initialized allocation description and `granularity` a valid
    // place for the driver to write the answer.
    unsafe {
        sys::cuMemGetAllocationGranularity(
            &mut granularity,
            &prop,
            sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
        )
    }
    .result()?;
    Ok(granularity.max(1) as u64)
}

impl Drop for CudaInner {
    /// Returns every handle this backend still owns to the driver.
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_err() {
            return;
        }
        let state = self.state.get_mut();
        let _ = result::ctx::synchronize();
        for (_, event) in state.events.drain() {
            // SAFETY: the event was created by this backend and is destroyed once, here.
            let _ = unsafe { result::event::destroy(event.0) };
        }
        for stream in state.streams.drain(..) {
            // SAFETY: the stream was created by this backend and is destroyed once, here.
            let _ = unsafe { result::stream::destroy(stream.0) };
        }
        for (addr, _) in state.segments.drain() {
            // SAFETY: `addr` came from `cuMemAlloc` and was not freed (it is still listed).
            let _ = unsafe { result::free_sync(addr) };
        }
        let pages = std::mem::take(&mut state.pages).into_iter().collect();
        let _ = CudaBackend::release_pages(pages, self.granularity);
        for (addr, size) in std::mem::take(&mut state.reservations) {
            // SAFETY: the range came from `cuMemAddressReserve` and its pages are unmapped.
            let _ = unsafe { sys::cuMemAddressFree(addr, size as usize) };
        }
    }
}

impl Backend for CudaBackend {
    fn name(&self) -> String {
        self.inner.name.clone()
    }

    fn kind(&self) -> &'static str {
        "cuda"
    }

    fn device_index(&self) -> u32 {
        self.inner.ordinal
    }

    fn malloc(&self, size: u64) -> Result<u64, BackendError> {
        self.bind()?;
        // SAFETY: the context is bound; `cuMemAlloc` returns a fresh allocation or an error.
        match unsafe { result::malloc_sync(size.max(1) as usize) } {
            Ok(addr) => {
                self.inner.state.lock().segments.insert(addr, size);
                Ok(addr)
            }
            Err(e) if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
                Err(self.out_of_memory(size))
            }
            Err(e) => Err(driver_error("cuMemAlloc", e)),
        }
    }

    fn free(&self, addr: u64) -> Result<(), BackendError> {
        self.bind()?;
        if self.inner.state.lock().segments.remove(&addr).is_none() {
            return Err(BackendError::InvalidAddress {
                addr,
                operation: "free",
            });
        }
        // SAFETY: `addr` came from `cuMemAlloc` on this context and was just removed from the
        // live list, so it is freed exactly once.
        unsafe { result::free_sync(addr) }.map_err(|e| driver_error("cuMemFree", e))
    }

    fn mem_info(&self) -> MemInfo {
        let total = self.inner.total;
        match self.bind().ok().and_then(|_| result::mem_get_info().ok()) {
            Some((free, total)) => MemInfo {
                free: free as u64,
                total: total as u64,
            },
            None => MemInfo { free: 0, total },
        }
    }

    fn create_stream(&self) -> Result<StreamId, BackendError> {
        self.bind()?;
        let stream = result::stream::create(result::stream::StreamKind::NonBlocking)
            .map_err(|e| driver_error("cuStreamCreate", e))?;
        let mut state = self.inner.state.lock();
        state.streams.push(RawStream(stream));
        Ok(StreamId(state.streams.len() as u64))
    }

    fn create_event(&self) -> Result<EventId, BackendError> {
        self.bind()?;
        let event = result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
            .map_err(|e| driver_error("cuEventCreate", e))?;
        let mut state = self.inner.state.lock();
        let id = state.next_event;
        state.next_event += 1;
        state.events.insert(id, RawEvent(event));
        Ok(EventId(id))
    }

    fn destroy_event(&self, event: EventId) -> Result<(), BackendError> {
        self.bind()?;
        let raw =
            self.inner
                .state
                .lock()
                .events
                .remove(&event.0)
                .ok_or(BackendError::InvalidHandle {
                    kind: "event",
                    id: event.0,
                })?;
        // SAFETY: the event was created here and removed from the table, so it is destroyed once.
        unsafe { result::event::destroy(raw.0) }.map_err(|e| driver_error("cuEventDestroy", e))
    }

    fn record_event(&self, event: EventId, stream: StreamId) -> Result<(), BackendError> {
        self.bind()?;
        let state = self.inner.state.lock();
        let raw_event = Self::event_handle(&state, event)?;
        let raw_stream = self.stream_handle(&state, stream)?;
        // SAFETY: both handles are live (they are in the tables, which the lock keeps stable).
        unsafe { result::event::record(raw_event, raw_stream) }
            .map_err(|e| driver_error("cuEventRecord", e))
    }

    fn query_event(&self, event: EventId) -> Result<bool, BackendError> {
        self.bind()?;
        let state = self.inner.state.lock();
        let raw = Self::event_handle(&state, event)?;
        // SAFETY: the event is live while the lock is held.
        match unsafe { result::event::query(raw) } {
            Ok(()) => Ok(true),
            Err(e) if e.0 == sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            Err(e) => Err(driver_error("cuEventQuery", e)),
        }
    }

    fn stream_wait_event(&self, stream: StreamId, event: EventId) -> Result<(), BackendError> {
        self.bind()?;
        let state = self.inner.state.lock();
        let raw_event = Self::event_handle(&state, event)?;
        let raw_stream = self.stream_handle(&state, stream)?;
        // SAFETY: both handles are live while the lock is held.
        unsafe {
            result::stream::wait_event(
                raw_stream,
                raw_event,
                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
        }
        .map_err(|e| driver_error("cuStreamWaitEvent", e))
    }

    fn synchronize_stream(&self, stream: StreamId) -> Result<(), BackendError> {
        self.bind()?;
        let raw = self.stream_handle(&self.inner.state.lock(), stream)?;
        // SAFETY: the stream handle is live (streams are only destroyed when the backend drops).
        unsafe { result::stream::synchronize(raw) }
            .map_err(|e| driver_error("cuStreamSynchronize", e))
    }

    fn synchronize(&self) -> Result<(), BackendError> {
        self.bind()?;
        result::ctx::synchronize().map_err(|e| driver_error("cuCtxSynchronize", e))
    }

    fn memset(&self, addr: u64, value: u8, len: u64, stream: StreamId) -> Result<(), BackendError> {
        if len == 0 {
            return Ok(());
        }
        let raw = self.raw_stream(stream)?;
        // SAFETY: the driver checks that `[addr, addr + len)` is device memory and reports an
        // error otherwise; the write is ordered on a live stream.
        unsafe { result::memset_d8_async(addr, value, len as usize, raw) }
            .map_err(|e| driver_error("cuMemsetD8Async", e))
    }

    fn copy_host_to_device(
        &self,
        dst: u64,
        src: &[u8],
        stream: StreamId,
    ) -> Result<(), BackendError> {
        if src.is_empty() {
            return Ok(());
        }
        let raw = self.raw_stream(stream)?;
        // SAFETY: `src` is a live host slice for the whole call: the copy is followed by a
        // stream synchronize, so the driver has read it before this function returns (as
        // PyTorch's blocking `copy_` does). The driver validates `dst`.
        unsafe {
            result::memcpy_htod_async(dst, src, raw).and_then(|_| result::stream::synchronize(raw))
        }
        .map_err(|e| driver_error("cuMemcpyHtoDAsync", e))
    }

    fn copy_device_to_host(
        &self,
        dst: &mut [u8],
        src: u64,
        stream: StreamId,
    ) -> Result<(), BackendError> {
        if dst.is_empty() {
            return Ok(());
        }
        let raw = self.raw_stream(stream)?;
        // SAFETY: `dst` is a live, exclusively borrowed host slice; the stream synchronize makes
        // the driver finish writing it before this function returns. The driver validates `src`.
        unsafe {
            result::memcpy_dtoh_async(dst, src, raw).and_then(|_| result::stream::synchronize(raw))
        }
        .map_err(|e| driver_error("cuMemcpyDtoHAsync", e))
    }

    fn copy_device_to_device(
        &self,
        dst: u64,
        src: u64,
        len: u64,
        stream: StreamId,
    ) -> Result<(), BackendError> {
        if len == 0 {
            return Ok(());
        }
        let raw = self.raw_stream(stream)?;
        // SAFETY: both ranges are device memory checked by the driver; no host memory is touched.
        unsafe { result::memcpy_dtod_async(dst, src, len as usize, raw) }
            .map_err(|e| driver_error("cuMemcpyDtoDAsync", e))
    }

    fn vm_granularity(&self) -> u64 {
        self.inner.granularity
    }

    fn reserve_address_range(&self, size: u64) -> Result<u64, BackendError> {
        self.bind()?;
        let g = self.inner.granularity;
        let size = size.max(1).div_ceil(g) * g;
        let mut addr: sys::CUdeviceptr = 0;
        // SAFETY: `addr` is a valid place for the driver to write the reserved address; the
        // size is a multiple of the granularity as the API requires.
        unsafe { sys::cuMemAddressReserve(&mut addr, size as usize, g as usize, 0, 0) }
            .result()
            .map_err(|e| driver_error("cuMemAddressReserve", e))?;
        self.inner.state.lock().reservations.insert(addr, size);
        Ok(addr)
    }

    fn release_address_range(&self, addr: u64, size: u64) -> Result<(), BackendError> {
        self.bind()?;
        let mut state = self.inner.state.lock();
        let reserved = match state.reservations.get(&addr) {
            Some(&reserved) if reserved >= size => reserved,
            _ => {
                return Err(BackendError::InvalidAddress {
                    addr,
                    operation: "release_address_range",
                })
            }
        };
        if state.pages.range(addr..addr + reserved).next().is_some() {
            return Err(BackendError::InvalidAddress {
                addr,
                operation: "release_address_range (pages still mapped)",
            });
        }
        // SAFETY: the range came from `cuMemAddressReserve` with this size and has no mapped
        // pages left; it is removed from the table below, so it is freed once.
        unsafe { sys::cuMemAddressFree(addr, reserved as usize) }
            .result()
            .map_err(|e| driver_error("cuMemAddressFree", e))?;
        state.reservations.remove(&addr);
        Ok(())
    }

    fn map(&self, addr: u64, size: u64) -> Result<(), BackendError> {
        let g = self.inner.granularity;
        if !addr.is_multiple_of(g) || !size.is_multiple_of(g) || size == 0 {
            return Err(BackendError::InvalidAddress {
                addr,
                operation: "map (range not page aligned)",
            });
        }
        self.bind()?;
        let mut state = self.inner.state.lock();
        let inside = state
            .reservations
            .range(..=addr)
            .next_back()
            .is_some_and(|(&base, &len)| addr + size <= base + len);
        if !inside || state.pages.range(addr..addr + size).next().is_some() {
            return Err(BackendError::InvalidAddress {
                addr,
                operation: "map",
            });
        }
        // One physical allocation per page, as PyTorch's expandable segments do, so that any
        // run of pages can be unmapped later on its own.
        let prop = Self::allocation_prop(self.inner.ordinal);
        let mut mapped: Vec<(u64, MappedPage)> = Vec::new();
        let mut failure = None;
        for page in (addr..addr + size).step_by(g as usize) {
            let mut handle: sys::CUmemGenericAllocationHandle = 0;
            // SAFETY: `prop` describes device memory on this backend's device; `handle` is a
            // valid place for the new handle.
            let created = unsafe { sys::cuMemCreate(&mut handle, g as usize, &prop, 0) }.result();
            if let Err(e) = created {
                failure = Some((e, "cuMemCreate"));
                break;
            }
            // SAFETY: `page` lies inside a reserved range and is not mapped (checked above);
            // `handle` is a fresh allocation of exactly one page.
            if let Err(e) = unsafe { sys::cuMemMap(page, g as usize, 0, handle, 0) }.result() {
                // SAFETY: the handle was created just above and never mapped.
                let _ = unsafe { sys::cuMemRelease(handle) };
                failure = Some((e, "cuMemMap"));
                break;
            }
            mapped.push((page, MappedPage { handle }));
        }
        if failure.is_none() {
            let access = sys::CUmemAccessDesc {
                location: prop.location,
                flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
            };
            // SAFETY: `[addr, addr + size)` is now fully mapped and `access` is one valid
            // descriptor.
            if let Err(e) = unsafe { sys::cuMemSetAccess(addr, size as usize, &access, 1) }.result()
            {
                failure = Some((e, "cuMemSetAccess"));
            }
        }
        match failure {
            None => {
                state.pages.extend(mapped);
                Ok(())
            }
            Some((e, call)) => {
                let _ = Self::release_pages(mapped, g);
                drop(state);
                if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
                    Err(self.out_of_memory(size))
                } else {
                    Err(driver_error(call, e))
                }
            }
        }
    }

    fn unmap(&self, addr: u64, size: u64) -> Result<(), BackendError> {
        self.bind()?;
        let g = self.inner.granularity;
        let mut state = self.inner.state.lock();
        let pages: Vec<u64> = (addr..addr.saturating_add(size))
            .step_by(g as usize)
            .collect();
        if size == 0
            || !addr.is_multiple_of(g)
            || pages.iter().any(|p| !state.pages.contains_key(p))
        {
            return Err(BackendError::InvalidAddress {
                addr,
                operation: "unmap",
            });
        }
        // Work queued earlier may still read these pages; unmapping under it would fault, so
        // wait for the device first (as PyTorch's expandable segments do). This is the slow
        // path: pages are unmapped only when the cache is emptied or memory runs out.
        result::ctx::synchronize().map_err(|e| driver_error("cuCtxSynchronize", e))?;
        let removed = pages
            .iter()
            .filter_map(|p| state.pages.remove(p).map(|page| (*p, page)))
            .collect();
        drop(state);
        Self::release_pages(removed, g)
    }
}

#[cfg(test)]
mod tests {
    //! These tests run on a machine with a CUDA driver and a device, and print one line saying
    //! they were skipped anywhere else.

    use super::*;

    fn device() -> Option<CudaBackend> {
        match CudaBackend::new(0) {
            Ok(dev) => Some(dev),
            Err(reason) => {
                vramscope_testkit::skip_notice(&format!("no CUDA driver ({reason})"));
                None
            }
        }
    }

    #[test]
    fn probing_never_panics() {
        match probe() {
            Ok(info) => assert!(info.version.0 >= 11, "{info:?}"),
            Err(reason) => assert!(!reason.is_empty()),
        }
        let _ = nvrtc_version();
    }

    #[test]
    fn cuda_segments_copies_and_memset_round_trip() {
        let Some(dev) = device() else { return };
        let a = dev.malloc(4096).unwrap();
        let b = dev.malloc(4096).unwrap();
        dev.copy_host_to_device(a + 10, b"hello", StreamId::DEFAULT)
            .unwrap();
        let s = dev.create_stream().unwrap();
        dev.copy_device_to_device(b, a + 10, 5, s).unwrap();
        dev.memset(b + 5, b'!', 2, s).unwrap();
        let e = dev.create_event().unwrap();
        dev.record_event(e, s).unwrap();
        dev.stream_wait_event(StreamId::DEFAULT, e).unwrap();
        dev.synchronize_stream(s).unwrap();
        assert!(dev.query_event(e).unwrap());
        let mut out = [0u8; 7];
        dev.copy_device_to_host(&mut out, b, s).unwrap();
        assert_eq!(&out, b"hello!!");
        dev.destroy_event(e).unwrap();
        assert!(dev.destroy_event(e).is_err());
        dev.free(a).unwrap();
        dev.free(b).unwrap();
        assert!(matches!(
            dev.free(a),
            Err(BackendError::InvalidAddress { .. })
        ));
        assert!(dev.mem_info().total > 0);
    }

    #[test]
    fn cuda_out_of_memory_is_an_error() {
        let Some(dev) = device() else { return };
        let total = dev.mem_info().total;
        match dev.malloc(total * 2) {
            Err(BackendError::OutOfMemory { requested, .. }) => assert_eq!(requested, total * 2),
            other => panic!("expected out of memory, got {other:?}"),
        }
    }

    #[test]
    fn cuda_virtual_memory_maps_pages_and_copies_across_them() {
        let Some(dev) = device() else { return };
        let g = dev.vm_granularity();
        let base = dev.reserve_address_range(4 * g).unwrap();
        dev.map(base, 2 * g).unwrap();
        let data: Vec<u8> = (0..=255).cycle().take(4096).collect();
        let at = base + g - 2048;
        dev.copy_host_to_device(at, &data, StreamId::DEFAULT)
            .unwrap();
        let mut back = vec![0; 4096];
        dev.copy_device_to_host(&mut back, at, StreamId::DEFAULT)
            .unwrap();
        assert_eq!(back, data);
        assert!(dev.map(base, g).is_err(), "double map");
        assert!(dev.release_address_range(base, 4 * g).is_err());
        dev.unmap(base + g, g).unwrap();
        dev.unmap(base, g).unwrap();
        dev.release_address_range(base, 4 * g).unwrap();
    }
}

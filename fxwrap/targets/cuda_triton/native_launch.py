"""The per-launch path of ``launcher.DriverLauncher`` in C: one binding for every kernel.

``DriverLauncher.__call__`` in Python reads each tensor's data pointer, checks their
alignment, packs the pointers and sizes into parameter slots, asks torch for the current
stream and calls ``cuLaunchKernel`` through ctypes: about 7 us a launch on an H100 host,
the largest share of a decode step's host time (194 launches a step).  Inductor launches
through a compiled binding.  fxwrap builds one binding (Python's C API only, with the host
C++ compiler, cached in ``FXWRAP_CACHE_DIR/launch`` beside the CPU trampoline) whose
``Launch`` objects hold a loaded kernel's ``CUfunction``, block size, shared memory and
argument kinds, and do that work in C::

    native = native_launch(driver, launch, grid, fallback)     # None where it cannot serve
    native(x, out, 1024)   # == cuLaunchKernel(f, grid(1024), 1, 1, threads, ..., stream, params)

Everything that is not the plain case goes back to ``fallback`` (the Python path, which
handles it as before): a pointer that is not 16-byte aligned (the launcher's unaligned
variants), a size beyond its int32 parameter, a grid past 2**31 - 1, a non-tensor where a
pointer goes, a Triton launch hook with calls (a profiler: it must see Triton's launch), and
a failed launch (the Python path recovers a thread without a context, or raises the driver's
error).  The binding is used only where the kernel's device is the only one (no device check
per call) and the grid is fixed, or computed by ``grid`` from the sizes.
"""
from __future__ import annotations

import ctypes
import logging
import struct

from fxwrap.targets.host import trampoline

log = logging.getLogger("fxwrap.kernels")

_MODULE = "fxwrap_cuda_launch"
#: the most parameter slots (pointers, sizes and Triton's scratch pointers) a launch takes here
MAX_SLOTS = 256


def source() -> str:
    """The binding's C++ source."""
    return trampoline.extension_source(
        title="fxwrap CUDA launch binding (fxwrap/targets/cuda_triton/native_launch.py)",
        module=_MODULE, includes=("string.h",),
        declarations="""typedef int (*launch_fn)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                         unsigned, void*, void**, void**);
""",
        functions=f"""
typedef struct {{
    PyObject_HEAD
    launch_fn launch;
    void* function;
    unsigned threads, shared;
    Py_ssize_t pointers, sizes, slots;
    char kinds[{MAX_SLOTS}];   // per size: 'i' int32, 'q' int64
    long long grid;            // > 0: fixed; 0: grid_fn(*sizes)
    PyObject* grid_fn;
    PyObject* stream_fn;       // torch._C._cuda_getCurrentRawStream
    PyObject* device;          // the kernel's device index (an int)
    PyObject* fallback;        // the Python launch path
    PyObject* chains;          // tuple of Triton HookChains: a non-empty .calls -> fallback
    PyObject* dict;
}} Launch;

static PyObject* calls_name = nullptr;

static PyObject* fall_back(Launch* self, PyObject* args, PyObject* kwargs) {{
    return PyObject_Call(self->fallback, args, kwargs);
}}

static PyObject* launch_call(PyObject* self_obj, PyObject* args, PyObject* kwargs) {{
    Launch* self = (Launch*)self_obj;
    Py_ssize_t n = PyTuple_GET_SIZE(args);
    if ((kwargs != nullptr && PyDict_GET_SIZE(kwargs) != 0) || n != self->pointers + self->sizes)
        return fall_back(self, args, kwargs);
    for (Py_ssize_t c = 0; c < PyTuple_GET_SIZE(self->chains); ++c) {{
        PyObject* calls = PyObject_GetAttr(PyTuple_GET_ITEM(self->chains, c), calls_name);
        if (calls == nullptr) {{ PyErr_Clear(); return fall_back(self, args, kwargs); }}
        int on = PyObject_IsTrue(calls);
        Py_DECREF(calls);
        if (on != 0) {{ if (on < 0) PyErr_Clear(); return fall_back(self, args, kwargs); }}
    }}
    uint64_t slot[{MAX_SLOTS}];
    void* params[{MAX_SLOTS}];
    for (Py_ssize_t i = 0; i < self->pointers; ++i) {{
        PyObject* t = PyTuple_GET_ITEM(args, i);
        PyTypeObject* type = Py_TYPE(t);
        if (type != plain_tensor && type != parameter) return fall_back(self, args, kwargs);
        uint64_t p = (uint64_t)(uintptr_t)tensor_data_ptr(t);
        if (p & 15) return fall_back(self, args, kwargs);
        slot[i] = p;
    }}
    for (Py_ssize_t i = 0; i < self->sizes; ++i) {{
        PyObject* v = PyTuple_GET_ITEM(args, self->pointers + i);
        if (!PyLong_CheckExact(v)) return fall_back(self, args, kwargs);
        long long s = PyLong_AsLongLong(v);
        if (s == -1 && PyErr_Occurred()) {{ PyErr_Clear(); return fall_back(self, args, kwargs); }}
        if (self->kinds[i] == 'i') {{
            if (s < -2147483648LL || s > 2147483647LL) return fall_back(self, args, kwargs);
            int32_t s32 = (int32_t)s;
            slot[self->pointers + i] = 0;
            memcpy(&slot[self->pointers + i], &s32, sizeof(s32));
        }} else {{
            slot[self->pointers + i] = (uint64_t)s;
        }}
    }}
    for (Py_ssize_t i = self->pointers + self->sizes; i < self->slots; ++i) slot[i] = 0;  // Triton's scratch
    for (Py_ssize_t i = 0; i < self->slots; ++i) params[i] = &slot[i];
    long long grid = self->grid;
    if (grid <= 0) {{
        PyObject* sizes = PyTuple_GetSlice(args, self->pointers, n);
        if (sizes == nullptr) return nullptr;
        PyObject* g = PyObject_Call(self->grid_fn, sizes, nullptr);
        Py_DECREF(sizes);
        if (g == nullptr) return nullptr;
        grid = PyLong_AsLongLong(g);
        Py_DECREF(g);
        if (grid == -1 && PyErr_Occurred()) return nullptr;
        if (grid <= 0) Py_RETURN_NONE;
    }}
    if (grid > 2147483647LL) return fall_back(self, args, kwargs);
    PyObject* s = PyObject_CallOneArg(self->stream_fn, self->device);
    if (s == nullptr) return nullptr;
    void* stream = PyLong_AsVoidPtr(s);
    Py_DECREF(s);
    if (stream == nullptr && PyErr_Occurred()) return nullptr;
    int result = self->launch(self->function, (unsigned)grid, 1, 1, self->threads, 1, 1, self->shared,
                              stream, self->slots ? params : nullptr, nullptr);
    if (result != 0) return fall_back(self, args, kwargs);  // the Python path recovers or raises
    Py_RETURN_NONE;
}}

static int launch_traverse(PyObject* self_obj, visitproc visit, void* arg) {{
    Launch* self = (Launch*)self_obj;
    Py_VISIT(self->grid_fn); Py_VISIT(self->stream_fn); Py_VISIT(self->device);
    Py_VISIT(self->fallback); Py_VISIT(self->chains); Py_VISIT(self->dict);
    return 0;
}}

static int launch_clear(PyObject* self_obj) {{
    Launch* self = (Launch*)self_obj;
    Py_CLEAR(self->grid_fn); Py_CLEAR(self->stream_fn); Py_CLEAR(self->device);
    Py_CLEAR(self->fallback); Py_CLEAR(self->chains); Py_CLEAR(self->dict);
    return 0;
}}

static void launch_dealloc(PyObject* self_obj) {{
    PyObject_GC_UnTrack(self_obj);
    launch_clear(self_obj);
    Py_TYPE(self_obj)->tp_free(self_obj);
}}

""",
        type_var="LaunchType", struct="Launch", type_name="fxwrap.CudaLaunch",
        flags="Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC",
        slots=(("tp_call", "launch_call"), ("tp_traverse", "launch_traverse"), ("tp_clear", "launch_clear"),
               ("tp_dealloc", "launch_dealloc")),
        make=f"""static PyObject* make(PyObject*, PyObject* args) {{
    unsigned long long launch, function;
    unsigned threads, shared;
    Py_ssize_t pointers, slots;
    const char* kinds;
    Py_ssize_t nkinds;
    long long grid;
    PyObject *grid_fn, *stream_fn, *device, *fallback, *chains;
    if (!PyArg_ParseTuple(args, "KKIInny#LOOOOO!", &launch, &function, &threads, &shared, &pointers, &slots,
                          &kinds, &nkinds, &grid, &grid_fn, &stream_fn, &device, &fallback,
                          &PyTuple_Type, &chains)) return nullptr;
    if (pointers < 0 || nkinds < 0 || slots < pointers + nkinds || slots > {MAX_SLOTS}) {{
        PyErr_SetString(PyExc_ValueError, "too many kernel parameters for the CUDA launch binding");
        return nullptr;
    }}
    Launch* self = PyObject_GC_New(Launch, &LaunchType);
    if (self == nullptr) return nullptr;
    self->launch = (launch_fn)(uintptr_t)launch;
    self->function = (void*)(uintptr_t)function;
    self->threads = threads; self->shared = shared;
    self->pointers = pointers; self->sizes = nkinds; self->slots = slots;
    memset(self->kinds, 0, sizeof(self->kinds));
    memcpy(self->kinds, kinds, (size_t)nkinds);
    self->grid = grid;
    Py_INCREF(grid_fn); self->grid_fn = grid_fn;
    Py_INCREF(stream_fn); self->stream_fn = stream_fn;
    Py_INCREF(device); self->device = device;
    Py_INCREF(fallback); self->fallback = fallback;
    Py_INCREF(chains); self->chains = chains;
    self->dict = nullptr;
    PyObject_GC_Track((PyObject*)self);
    return (PyObject*)self;
}}

""",
        make_doc='''"make(cuLaunchKernel, CUfunction, threads, shared, pointers, slots, "
                                 "size kinds, grid, grid_fn, stream_fn, device, fallback, hook chains)"''',
        prologue='''    calls_name = PyUnicode_InternFromString("calls");
    if (calls_name == nullptr) return nullptr;
''')


def size_kinds(slot_format: str, npointers: int, nsizes: int) -> bytes | None:
    """``b"iq"`` for two sizes of int32 then int64 parameters, read from the driver's
    ``struct`` slot format (``cuda_driver.slot_format``: ``"<QQi4xq"``); None if unreadable."""
    codes = [c for c in slot_format.lstrip("<").replace("4x", "") if c in "Qiq"]
    if len(codes) < npointers + nsizes or any(c != "Q" for c in codes[:npointers]):
        return None
    kinds = codes[npointers:npointers + nsizes]
    return "".join(kinds).encode() if all(k in "iq" for k in kinds) else None


def native_launch(driver, slot_format: str, npointers: int, nsizes: int, grid: int, grid_fn, chains,
                  fallback, stream_fn):
    """The binding's ``Launch`` for ``driver`` (a ``cuda_driver.DriverKernel``), or None where it
    cannot serve (no data-pointer read in this torch, no compiler, too many parameters)."""
    if not trampoline.has_data_ptr_read() or struct.calcsize("P") != 8 or driver.nslots > MAX_SLOTS:
        return None
    kinds = size_kinds(slot_format, npointers, nsizes)
    if kinds is None:
        return None
    module = trampoline.python_extension(_MODULE, source(), what="CUDA launch binding (kernels launch "
                                         "through ctypes)")
    if module is None:
        return None
    address = ctypes.cast(driver.cu_launch, ctypes.c_void_p).value
    return module.make(address, driver.function.value, driver.threads, driver.shared, npointers,
                       driver.nslots, kinds, grid, grid_fn, stream_fn, driver.device_index, fallback,
                       tuple(chains))


"""One C extension that launches any C kernel: the launch without ctypes.

A ctypes launcher (``loader.make_launcher``) costs, per launch, a Python frame, one
``tensor.data_ptr()`` call per tensor and ctypes' argument conversion: about 1.7 us for a
kernel of three tensors, more than some of the kernels of a decode step take.  Inductor's
CPU wrappers call a Python binding compiled with each kernel.  fxwrap compiles one binding
for all kernels, once per compiler and cache directory: a ``Launcher`` holds a kernel's
function address and how many tensors and sizes it takes; calling it reads each tensor's
data pointer through the function torch exports for this
(``torch._C._dynamo.guards._torchinductor_pyobject_tensor_data_ptr``: no torch headers to
compile; a tensor subclass other than ``Parameter`` calls its own ``data_ptr()``), converts each size to an ``int64_t`` and calls the kernel with the GIL released,
as ctypes does::

    launch = c_launcher(address, pointers=2, sizes=1, name="fxwrap_pointwise_0")
    launch(x, out, 1024)   # == fxwrap_pointwise_0(x.data_ptr(), out.data_ptr(), 1024)

Every argument of a kernel is a pointer or an ``int64_t`` (``loader.c_function``): on the
64-bit ABIs fxwrap builds for (x86-64 System V, AArch64) both travel in the same integer
registers and stack slots, so one call shape per argument count serves every kernel.  A
kernel of more than :data:`MAX_ARGS` arguments, a torch without the exported function or a
host whose compiler cannot build the binding keeps its ctypes launcher (``c_launcher``
returns None).  A wrong argument (not a tensor where a pointer goes, a count that differs)
raises ``TypeError`` naming the kernel, before the kernel runs.
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import logging
import struct
import sysconfig
import threading
from pathlib import Path

import torch

from fxwrap.targets.host.compiler import CompileError, CppCompiler, default_compiler

log = logging.getLogger("fxwrap.kernels")

#: the most arguments (tensors + sizes) a launch through the binding takes
MAX_ARGS = 48

_MODULE = "fxwrap_launch_trampoline"
_data_ptr_address = getattr(getattr(getattr(torch._C, "_dynamo", None), "guards", None),
                            "_torchinductor_pyobject_tensor_data_ptr", None)


#: C shared by fxwrap's launch bindings: torch's tensor data-pointer read and the tensor types,
#: set by the module's ``init(address, TensorBase, Tensor, Parameter)`` (``python_extension`` calls it)
TENSOR_READ = """static void* (*tensor_data_ptr)(PyObject*) = nullptr;
static PyTypeObject* tensor_type = nullptr;   // torch._C.TensorBase
static PyTypeObject* plain_tensor = nullptr;  // torch.Tensor
static PyTypeObject* parameter = nullptr;     // torch.nn.Parameter

static PyObject* init(PyObject*, PyObject* args) {
    unsigned long long address;
    PyObject *base, *plain, *param;
    if (!PyArg_ParseTuple(args, "KO!O!O!", &address, &PyType_Type, &base, &PyType_Type, &plain,
                          &PyType_Type, &param)) return nullptr;
    tensor_data_ptr = (void* (*)(PyObject*))(uintptr_t)address;
    Py_INCREF(base); Py_INCREF(plain); Py_INCREF(param);
    tensor_type = (PyTypeObject*)base;
    plain_tensor = (PyTypeObject*)plain;
    parameter = (PyTypeObject*)param;
    Py_RETURN_NONE;
}
"""


def extension_source(*, title: str, module: str, includes: tuple[str, ...] = (), declarations: str,
                     functions: str, type_var: str, struct: str, type_name: str, flags: str, slots: tuple,
                     make: str, make_doc: str, prologue: str = "") -> str:
    """The C++ source of one of fxwrap's Python extensions (Python's C API only): the skeleton
    every binding shares around its own parts.

    In order: ``// title``, Python.h and the standard headers (``includes`` more), the binding's
    ``declarations`` then ``TENSOR_READ`` (its ``init``), its ``functions``, the one type
    ``type_var`` (C struct ``struct``, Python name ``type_name``), its ``make`` function, the
    methods ``init`` and ``make`` (``make_doc``: the C string literal of make's docstring), the
    module ``module`` and ``PyInit_<module>``, which runs ``prologue`` then readies the type:
    ``tp_name``, ``tp_basicsize``, ``tp_flags``, the ``slots`` (``(("tp_call", "launch_call"),
    ...)``), and an instance ``__dict__`` (``struct``'s ``dict`` member)."""
    headers = "".join(f"#include <{h}>\n" for h in ("stdint.h", "stddef.h", *includes))
    slot_lines = "".join(f"    {type_var}.{slot} = {value};\n" for slot, value in slots)
    return f"""// {title}
#define PY_SSIZE_T_CLEAN
#include <Python.h>
{headers}
{declarations}{TENSOR_READ}
{functions}static PyTypeObject {type_var} = {{PyVarObject_HEAD_INIT(nullptr, 0)}};

{make}static PyMethodDef methods[] = {{
    {{"init", init, METH_VARARGS, "init(data_ptr function address, TensorBase, Tensor, Parameter)"}},
    {{"make", make, METH_VARARGS, {make_doc}}},
    {{nullptr, nullptr, 0, nullptr}}}};

static struct PyModuleDef module_def = {{PyModuleDef_HEAD_INIT, "{module}", nullptr, -1, methods}};

extern "C" PyMODINIT_FUNC PyInit_{module}(void) {{
{prologue}    {type_var}.tp_name = "{type_name}";
    {type_var}.tp_basicsize = sizeof({struct});
    {type_var}.tp_flags = {flags};
{slot_lines}    {type_var}.tp_dictoffset = offsetof({struct}, dict);
    {type_var}.tp_getattro = PyObject_GenericGetAttr;
    {type_var}.tp_setattro = PyObject_GenericSetAttr;
    if (PyType_Ready(&{type_var}) < 0) return nullptr;
    return PyModule_Create(&module_def);
}}
"""


def _calls() -> str:
    """The ``switch`` over argument counts: ``case 2: ((void (*)(I, I))fn)(a[0], a[1]); break;``."""
    lines = []
    for n in range(MAX_ARGS + 1):
        params = ", ".join(["I"] * n) or "void"
        args = ", ".join(f"a[{i}]" for i in range(n))
        lines.append(f"    case {n}: ((void (*)({params}))fn)({args}); break;")
    return "\n".join(lines)


def source() -> str:
    """The binding's C++ source (Python's C API only)."""
    return extension_source(
        title="fxwrap launch trampoline: every C kernel's launcher (fxwrap/targets/host/trampoline.py)",
        module=_MODULE, declarations='typedef int64_t I;\n',
        functions=f"""
typedef struct {{
    PyObject_HEAD
    void* fn;
    Py_ssize_t pointers;
    Py_ssize_t sizes;
    PyObject* name;
    PyObject* dict;
}} Launcher;

static void call(void* fn, Py_ssize_t n, const I* a) {{
    switch (n) {{
{_calls()}
    }}
}}

static PyObject* launcher_call(PyObject* self_obj, PyObject* args, PyObject* kwargs) {{
    Launcher* self = (Launcher*)self_obj;
    Py_ssize_t n = PyTuple_GET_SIZE(args);
    if (kwargs != nullptr && PyDict_GET_SIZE(kwargs) != 0) {{
        PyErr_Format(PyExc_TypeError, "kernel %U takes no keyword arguments", self->name);
        return nullptr;
    }}
    if (n != self->pointers + self->sizes) {{
        PyErr_Format(PyExc_TypeError, "kernel %U takes %zd tensors and %zd sizes, got %zd arguments",
                     self->name, self->pointers, self->sizes, n);
        return nullptr;
    }}
    I a[{MAX_ARGS}];
    for (Py_ssize_t i = 0; i < self->pointers; ++i) {{
        PyObject* t = PyTuple_GET_ITEM(args, i);
        PyTypeObject* type = Py_TYPE(t);
        if (type == plain_tensor || type == parameter) {{  // torch's read (it expects a tensor with data)
            a[i] = (I)(intptr_t)tensor_data_ptr(t);
            continue;
        }}
        if (!PyObject_TypeCheck(t, tensor_type)) {{
            PyErr_Format(PyExc_TypeError, "kernel %U: argument %zd is a %s, not a tensor",
                         self->name, i, type->tp_name);
            return nullptr;
        }}
        PyObject* p = PyObject_CallMethod(t, "data_ptr", nullptr);  // a subclass: its own data_ptr()
        if (p == nullptr) return nullptr;
        a[i] = (I)PyLong_AsLongLong(p);
        Py_DECREF(p);
        if (a[i] == -1 && PyErr_Occurred()) return nullptr;
    }}
    for (Py_ssize_t i = self->pointers; i < n; ++i) {{
        a[i] = (I)PyLong_AsLongLong(PyTuple_GET_ITEM(args, i));
        if (a[i] == -1 && PyErr_Occurred()) {{
            PyErr_Clear();
            PyObject* v = PyNumber_Index(PyTuple_GET_ITEM(args, i));  // a SymInt-like value: int() of it
            if (v == nullptr) return nullptr;
            a[i] = (I)PyLong_AsLongLong(v);
            Py_DECREF(v);
            if (a[i] == -1 && PyErr_Occurred()) return nullptr;
        }}
    }}
    Py_BEGIN_ALLOW_THREADS
    call(self->fn, n, a);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}}

static void launcher_dealloc(PyObject* self_obj) {{
    Launcher* self = (Launcher*)self_obj;
    Py_XDECREF(self->name);
    Py_XDECREF(self->dict);
    Py_TYPE(self_obj)->tp_free(self_obj);
}}

static PyObject* launcher_repr(PyObject* self_obj) {{
    return PyUnicode_FromFormat("<fxwrap launcher %U>", ((Launcher*)self_obj)->name);
}}

""",
        type_var="LauncherType", struct="Launcher", type_name="fxwrap.Launcher", flags="Py_TPFLAGS_DEFAULT",
        slots=(("tp_call", "launcher_call"), ("tp_dealloc", "launcher_dealloc"), ("tp_repr", "launcher_repr")),
        make=f"""static PyObject* make(PyObject*, PyObject* args) {{
    unsigned long long fn;
    Py_ssize_t pointers, sizes;
    PyObject* name;
    if (!PyArg_ParseTuple(args, "KnnU", &fn, &pointers, &sizes, &name)) return nullptr;
    if (pointers < 0 || sizes < 0 || pointers + sizes > {MAX_ARGS}) {{
        PyErr_SetString(PyExc_ValueError, "too many kernel arguments for the trampoline");
        return nullptr;
    }}
    Launcher* self = PyObject_New(Launcher, &LauncherType);
    if (self == nullptr) return nullptr;
    self->fn = (void*)(uintptr_t)fn;
    self->pointers = pointers;
    self->sizes = sizes;
    Py_INCREF(name);
    self->name = name;
    self->dict = nullptr;
    return (PyObject*)self;
}}

""",
        make_doc='"make(function address, pointers, sizes, name) -> launcher"')


_LOCK = threading.Lock()
_LOADED: dict[str, object] = {}  # shared object path -> the module (None: it failed)


_BINDING_COMPILERS: dict[str, CppCompiler] = {}  # kernel cache directory -> the binding's compiler


def _binding_compiler(compiler: CppCompiler) -> CppCompiler:
    """``compiler``'s command and flags with a cache directory of its own beside the kernels'
    (``launch``): the binding is fxwrap's, not a program's kernel, and outlives a cleared
    kernel cache (a warm start that finds the programs compiles nothing)."""
    key = str(compiler.cache.dir)
    with _LOCK:
        if key not in _BINDING_COMPILERS:
            _BINDING_COMPILERS[key] = CppCompiler(compiler.cxx, compiler.flags,
                                                  cache_dir=Path(compiler.cache.dir).parent / "launch")
        return _BINDING_COMPILERS[key]


def _include_flags() -> tuple[str, ...]:
    return (f"-I{sysconfig.get_paths()['include']}",)


def binding_file(compiler: CppCompiler | None = None) -> Path:
    """Where the binding built with ``compiler``'s command (default: the host compiler) lives
    in the cache, built or not: a precompiled function (fxwrap/programs/precompile.py) carries it to a
    process whose cache directory is empty, which then builds nothing."""
    binding = _binding_compiler(compiler or default_compiler())
    return binding.cache.path(binding.key(source(), _include_flags()))


def python_extension(name: str, text: str, compiler: CppCompiler | None = None, what: str = "binding"):
    """The Python extension module ``name`` built from C++ ``text`` (Python's C API only) with
    ``compiler``'s command, cached on disk like a kernel in the ``launch`` directory, imported
    once per process, and given torch's tensor data-pointer read (``init(address, TensorBase,
    Tensor, Parameter)``); None (logged) where it does not build."""
    try:
        path = str(_binding_compiler(compiler or default_compiler()).compile(text, extra_flags=_include_flags()))
    except CompileError as exc:
        log.warning("fxwrap: the %s does not build (%s)", what, str(exc).splitlines()[0])
        return None
    with _LOCK:
        if path not in _LOADED:
            loader = importlib.machinery.ExtensionFileLoader(name, path)
            spec = importlib.util.spec_from_file_location(name, path, loader=loader)
            module = importlib.util.module_from_spec(spec)
            loader.exec_module(module)
            module.init(_data_ptr_address, torch._C.TensorBase, torch.Tensor, torch.nn.Parameter)
            _LOADED[path] = module
        return _LOADED[path]


def _module(compiler: CppCompiler):
    """The binding built with ``compiler``'s command (cached on disk like a kernel, in its own
    directory) and imported once."""
    return python_extension(_MODULE, source(), compiler, "C launch trampoline (kernels launch through ctypes)")


_STARTED: set[str] = set()  # cache directories whose binding is being built or loaded


def prepare(compiler: CppCompiler | None = None) -> None:
    """Start building (or loading) the binding in a thread, once per cache directory: the
    first kernels compile meanwhile, and ``c_launcher`` then finds it built (a cold build
    is a few seconds of g++ parsing Python.h)."""
    if _data_ptr_address is None:
        return
    compiler = compiler or default_compiler()
    key = str(compiler.cache.dir)
    with _LOCK:
        if key in _STARTED:
            return
        _STARTED.add(key)
    threading.Thread(target=_module, args=(compiler,), name="fxwrap-trampoline", daemon=True).start()


def has_data_ptr_read() -> bool:
    """This torch exports the C function that reads a tensor's data pointer (the bindings need it)."""
    return _data_ptr_address is not None


def c_launcher(address: int, pointers: int, sizes: int, name: str, compiler: CppCompiler | None = None):
    """A launcher calling the C function at ``address`` (``pointers`` tensors, then ``sizes``
    int64 sizes), or None where the binding cannot serve it (see the module docstring)."""
    if _data_ptr_address is None or pointers + sizes > MAX_ARGS or struct.calcsize("P") != 8:
        return None
    module = _module(compiler or default_compiler())
    return None if module is None else module.make(address, pointers, sizes, name)

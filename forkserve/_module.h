/* forkserve/_module.h: the one way forkserve's C extensions
 * (memory/_immortal, memory/_whywalk, memory/_free_space, http/_h1,
 * process/_greenlet_local) are built as modules.
 *
 * Invariants:
 * - Single-phase init and no per-module state (m_size -1): what a module
 *   keeps (borrowed builtin methods, an exception type) lives in C statics
 *   set at its first import, and it is imported once per process.
 * - MODULE_DEF(name, doc, methods) is its PyModuleDef; PyInit_<name>()
 *   returns module_create(&def, fill). fill(module), unless NULL, adds the
 *   module's constants and exceptions; if it fails (-1, an exception set),
 *   the half-built module is dropped and the import fails with that
 *   exception.
 */
#ifndef FORKSERVE_MODULE_H
#define FORKSERVE_MODULE_H

#include <Python.h>

#define MODULE_DEF(name, doc, methods) {                                    \
    PyModuleDef_HEAD_INIT, .m_name = (name), .m_doc = (doc), .m_size = -1,  \
    .m_methods = (methods),                                                 \
}

static PyObject *
module_create(struct PyModuleDef *def, int (*fill)(PyObject *module))
{
    PyObject *module = PyModule_Create(def);
    if (module != NULL && fill != NULL && fill(module) < 0) {
        Py_CLEAR(module);
    }
    return module;
}

#endif /* FORKSERVE_MODULE_H */

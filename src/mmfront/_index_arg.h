/* An int argument of a C function of mmfront's extensions, checked: shared by mmfront._pixels
   and mmfront._bicubic. Include after <Python.h>. */

#ifndef MMFRONT_INDEX_ARG_H
#define MMFRONT_INDEX_ARG_H

/* An int argument as a Py_ssize_t: TypeError for a non-int, ValueError for one out of range. */
static int
index_arg(PyObject *arg, const char *name, Py_ssize_t *value)
{
    if (!PyLong_Check(arg)) {
        PyErr_Format(PyExc_TypeError, "%s must be an int, not %.100s", name, Py_TYPE(arg)->tp_name);
        return -1;
    }
    *value = PyLong_AsSsize_t(arg);
    if (*value == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "%s is out of range", name);
        return -1;
    }
    return 0;
}

#endif

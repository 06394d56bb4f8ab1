/*
 * The in-process view of THE CUDA double (tests/doubles/fake_libcuda.h):
 * its state (fc, fc_current, fc_add*), and fc_reset(), which installs it in
 * drc's one driver table. A test that includes this links the double
 * (build/fakecuda/libcuda.so.1: the tests of tests/cuda and tests/verbs do,
 * by the Makefile's folder rule).
 */
#ifndef DRC_TEST_FAKE_CUDA_H
#define DRC_TEST_FAKE_CUDA_H

#include "cuda/cuda.h"
#include "doubles/fake_libcuda.h"

#endif

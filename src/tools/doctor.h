/* `drc doctor`: what this machine needs to register GPU memory for RDMA (doctor.c). */
#ifndef DRC_DOCTOR_H
#define DRC_DOCTOR_H

int drc__doctor(int argc, char **argv);

#endif

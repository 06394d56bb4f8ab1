/* PLACEHOLDER until the CUDA issue: the doctor prints only that it is not built yet. */
#include <stdio.h>

#include "doctor.h"

int drc__doctor(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    printf("drc doctor: not implemented yet\n");
    return 0;
}

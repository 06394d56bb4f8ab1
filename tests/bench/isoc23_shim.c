/*
 * glibc 2.38's C23 names of strtol and scanf, for a UCX built on a newer Debian than the one it
 * runs on (tests/bench/ucx_deb.sh builds this into the UCX prefix as libisoc23.so; never part of
 * drc). glibc 2.38 compiles strtol(), sscanf() ... in C2x mode to these names; the C23 versions
 * differ from the older ones only in also reading binary numbers ("0b101" with base 0 or 2, "%i",
 * "%b"), which UCX's configuration and /proc parsing, the only callers, are never given. The rcache
 * operations that the benchmarks measure call none of them.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

long __isoc23_strtol(const char *s, char **end, int base);
unsigned long __isoc23_strtoul(const char *s, char **end, int base);
long long __isoc23_strtoll(const char *s, char **end, int base);
unsigned long long __isoc23_strtoull(const char *s, char **end, int base);
int __isoc23_vsscanf(const char *s, const char *fmt, va_list ap);
int __isoc23_vfscanf(FILE *f, const char *fmt, va_list ap);
int __isoc23_sscanf(const char *s, const char *fmt, ...);
int __isoc23_fscanf(FILE *f, const char *fmt, ...);
int __isoc23_scanf(const char *fmt, ...);

long __isoc23_strtol(const char *s, char **end, int base) { return strtol(s, end, base); }
unsigned long __isoc23_strtoul(const char *s, char **end, int base) { return strtoul(s, end, base); }
long long __isoc23_strtoll(const char *s, char **end, int base) { return strtoll(s, end, base); }
unsigned long long __isoc23_strtoull(const char *s, char **end, int base) { return strtoull(s, end, base); }
int __isoc23_vsscanf(const char *s, const char *fmt, va_list ap) { return vsscanf(s, fmt, ap); }
int __isoc23_vfscanf(FILE *f, const char *fmt, va_list ap) { return vfscanf(f, fmt, ap); }

int __isoc23_sscanf(const char *s, const char *fmt, ...)
{
    va_list ap;
    int r;

    va_start(ap, fmt);
    r = vsscanf(s, fmt, ap);
    va_end(ap);
    return r;
}

int __isoc23_fscanf(FILE *f, const char *fmt, ...)
{
    va_list ap;
    int r;

    va_start(ap, fmt);
    r = vfscanf(f, fmt, ap);
    va_end(ap);
    return r;
}

int __isoc23_scanf(const char *fmt, ...)
{
    va_list ap;
    int r;

    va_start(ap, fmt);
    r = vscanf(fmt, ap);
    va_end(ap);
    return r;
}

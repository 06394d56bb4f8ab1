/*
 * The helpers the test programs share (libc only; the cache tests' own are in
 * cachetest.h, the doubles in backend.h and tests/doubles/).
 */
#ifndef DRC_TEST_HELPERS_H
#define DRC_TEST_HELPERS_H

#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The file descriptors open in this process (leak checks: a count before, the same count after). */
static inline int fds_open(void)
{
    DIR *d = opendir("/proc/self/fd");
    int n = 0;

    while (d && readdir(d))
        n++;
    if (d)
        closedir(d);
    return n;
}

/*
 * For tests that run helper programs the Makefile built: find the build
 * folder, the nearest folder above the test binary that holds @probe (e.g.
 * "engine/engine_child"), or $DRC_TEST_BUILD when set.
 */
static inline int find_build_dir(char *build, size_t size, const char *probe_rel)
{
    char exe[PATH_MAX], probe[PATH_MAX + 64];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    const char *env = getenv("DRC_TEST_BUILD");
    int up;

    if (env) {
        snprintf(build, size, "%s", env);
        return 0;
    }
    if (n <= 0)
        return -1;
    exe[n] = 0;
    for (up = 0; up < 4; up++) {
        char *slash = strrchr(exe, '/');

        if (!slash)
            return -1;
        *slash = 0;
        snprintf(probe, sizeof(probe), "%s/%s", exe, probe_rel);
        if (access(probe, X_OK) == 0) {
            snprintf(build, size, "%s", exe);
            return 0;
        }
    }
    return -1;
}

/* mkdir -p @path (errors are the caller's next call's to report). */
static inline void mkdirs(const char *path)
{
    char p[PATH_MAX], *s;

    snprintf(p, sizeof(p), "%s", path);
    for (s = p + 1; *s; s++) {
        if (*s != '/')
            continue;
        *s = 0;
        mkdir(p, 0755);
        *s = '/';
    }
    mkdir(p, 0755);
}

/*
 * A fake sysfs under @root (DRC_SYSFS_ROOT): a PCI function at
 * devices/<chain> (e.g. "pci0000:00/0000:00:01.0/0000:01:00.0"), linked from
 * bus/pci/devices, and, given @ibdev, the RDMA device of that function
 * (class/infiniband/<ibdev>/device). 0, or -1 with errno.
 */
static inline int fake_sysfs_pci(const char *root, const char *chain, const char *ibdev)
{
    char dir[PATH_MAX], link[PATH_MAX];

    snprintf(dir, sizeof(dir), "%s/devices/%s", root, chain);
    mkdirs(dir);
    snprintf(link, sizeof(link), "%s/bus/pci/devices", root);
    mkdirs(link);
    snprintf(link, sizeof(link), "%s/bus/pci/devices/%s", root, strrchr(chain, '/') + 1);
    unlink(link);
    if (symlink(dir, link))
        return -1;
    if (!ibdev)
        return 0;
    snprintf(link, sizeof(link), "%s/class/infiniband/%s", root, ibdev);
    mkdirs(link);
    snprintf(link, sizeof(link), "%s/class/infiniband/%s/device", root, ibdev);
    return symlink(dir, link);
}

#endif

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
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* In a fork() child: exit with status @n unless @cond holds (the parent reads which check failed). */
#define CHILD_CHECK(n, cond)  \
    do {                      \
        if (!(cond))          \
            _exit(n);         \
    } while (0)

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

/* Read @fd to its end into @buf, NUL-terminated (what does not fit in @len - 1 bytes is dropped). */
static inline void drain_fd(int fd, char *buf, size_t len)
{
    size_t total = 0;
    ssize_t got;

    while (total < len - 1 && (got = read(fd, buf + total, len - 1 - total)) > 0)
        total += (size_t)got;
    buf[total] = 0;
}

/*
 * Run @path with @argv and @envp; its stdout into @out and its stderr into
 * @err (drain_fd). For programs that write little: stdout is read to its end
 * before stderr. The wait status, or -1 where a pipe, the spawn or the wait
 * failed.
 */
static inline int spawn_capture(const char *path, char *const argv[], char *const envp[], char *out, size_t outlen,
                                char *err, size_t errlen)
{
    posix_spawn_file_actions_t fa;
    int po[2], pe[2], status = -1, rc;
    pid_t pid;

    if (pipe(po))
        return -1;
    if (pipe(pe)) {
        close(po[0]);
        close(po[1]);
        return -1;
    }
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, po[1], 1);
    posix_spawn_file_actions_adddup2(&fa, pe[1], 2);
    posix_spawn_file_actions_addclose(&fa, po[0]);
    posix_spawn_file_actions_addclose(&fa, pe[0]);
    rc = posix_spawn(&pid, path, &fa, NULL, argv, envp);
    posix_spawn_file_actions_destroy(&fa);
    close(po[1]);
    close(pe[1]);
    if (!rc) {
        drain_fd(po[0], out, outlen);
        drain_fd(pe[0], err, errlen);
    }
    close(po[0]);
    close(pe[0]);
    if (!rc && waitpid(pid, &status, 0) != pid)
        status = -1;
    return status;
}

#endif

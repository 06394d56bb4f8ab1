/*
 * The PCI path between a GPU and a NIC, read from sysfs (see topo.h).
 *
 * sysfs lays PCI devices out as the bus is: every device's canonical path is
 *   /sys/devices/pciDDDD:BB/<root port>/<switch upstream port>/<downstream port>/<endpoint>
 * with a folder per bridge on the way, named by its address. bus/pci/devices/<addr>
 * and class/infiniband/<name>/device are links into that tree. Two endpoints
 * whose canonical paths share a folder below the root port sit under one
 * switch (NCCL's PIX/PXB); if the deepest shared folder is a root port, the
 * host bridge, or nothing at all, traffic between them crosses the root
 * complex (PHB/SYS). A root port is told from a switch port by its parent:
 * a root port's parent is the host bridge folder, which is not a PCI address.
 */
#include "verbs/topo.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* "DDDD:BB:DD.F", lower case: the form of a sysfs PCI folder name. */
static int is_pci_addr(const char *s, size_t n)
{
    static const char shape[] = "xxxx:xx:xx.x";
    size_t i;

    if (n != sizeof(shape) - 1)
        return 0;
    for (i = 0; i < n; i++) {
        int hex = (s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f');

        if (shape[i] == 'x' ? !hex : s[i] != shape[i])
            return 0;
    }
    return 1;
}

static int canonical(char *out, const char *root, const char *fmt, const char *name)
{
    char link[PATH_MAX];

    if (snprintf(link, sizeof(link), fmt, root, name) >= (int)sizeof(link))
        return -ENAMETOOLONG;
    return realpath(link, out) ? 0 : -ENOENT;
}

int drc__topo_path(const char *root, const char *gpu_bus_id, const char *ibdev)
{
    char gpu[PATH_MAX], nic[PATH_MAX], addr[16];
    unsigned dom, bus, dev, fn;
    const char *prev = NULL, *cur = NULL;  /* the last two shared path components */
    size_t prev_len = 0, cur_len = 0, i;
    int n = -1, err;

    if (!root || !gpu_bus_id || !ibdev || !*ibdev || strchr(ibdev, '/'))
        return -EINVAL;
    if (strspn(gpu_bus_id, "0123456789abcdefABCDEF:.") != strlen(gpu_bus_id) ||   /* no "0x", signs, spaces */
        sscanf(gpu_bus_id, "%x:%x:%x.%x%n", &dom, &bus, &dev, &fn, &n) != 4 ||
        gpu_bus_id[n] || dom > 0xffff || bus > 0xff || dev > 0x1f || fn > 7)
        return -EINVAL;
    snprintf(addr, sizeof(addr), "%04x:%02x:%02x.%x", dom, bus, dev, fn);
    err = canonical(gpu, root, "%s/bus/pci/devices/%s", addr);
    if (!err)
        err = canonical(nic, root, "%s/class/infiniband/%s/device", ibdev);
    if (err)
        return err;

    /* Walk the shared components, remembering the deepest two. */
    for (i = 0; gpu[i] && gpu[i] == nic[i]; i++) {
        if (gpu[i] != '/')
            continue;
        size_t start = i + 1, end = start;

        while (gpu[end] && gpu[end] != '/' && gpu[end] == nic[end])
            end++;
        /* a component is shared only if it ends at the same place in both paths */
        if ((gpu[end] == '/' || !gpu[end]) && (nic[end] == '/' || !nic[end]) && end > start) {
            prev = cur, prev_len = cur_len;
            cur = gpu + start, cur_len = end - start;
        }
    }
    if (cur && prev && is_pci_addr(cur, cur_len) && is_pci_addr(prev, prev_len))
        return DRC__PATH_SWITCH;
    return DRC__PATH_HOST;
}

int drc__topo_mapping(int path, const char *override)
{
    if (!override || !*override || !strcmp(override, "auto"))
        return path == DRC__PATH_SWITCH ? DRC__MAPPING_PCIE : DRC__MAPPING_DEFAULT;
    if (!strcmp(override, "pcie"))
        return DRC__MAPPING_PCIE;
    if (!strcmp(override, "default"))
        return DRC__MAPPING_DEFAULT;
    return -EINVAL;
}

const char *drc__topo_mapping_name(int mapping)
{
    return mapping == DRC__MAPPING_PCIE ? "pcie" : "default";
}

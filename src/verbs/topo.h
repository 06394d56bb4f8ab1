/*
 * Where a NIC sits relative to a GPU on the PCI bus (topo.c), and so which
 * dmabuf mapping type its registrations of that GPU's memory need.
 *
 * A CUDA dmabuf encodes one DMA path to GPU memory (libfabric PR 12864): a NIC
 * under the same PCIe switch as the GPU reaches it peer to peer and needs the
 * PCIe mapping type (CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE); a NIC
 * reached through a host bridge needs the default mapping. The wrong one is
 * not an error at registration: ibv_reg_dmabuf_mr succeeds and the transfer
 * fails later. So the type is decided from the topology, per (GPU, NIC) pair,
 * never by "try PCIe and fall back".
 *
 * Every function takes the sysfs root ("/sys" on a real machine) so that
 * tests can lay machines out as directory trees.
 */
#ifndef DRC_TOPO_H
#define DRC_TOPO_H

#include <stddef.h>

enum drc__pci_path {
    DRC__PATH_SWITCH = 1,   /* a common ancestor below the root port: one PCIe switch (or a tree of them) */
    DRC__PATH_HOST   = 2,   /* the paths meet at a root port or a host bridge, or not at all: through the CPU */
};

/*
 * The path between the PCI device @gpu_bus_id ("DDDD:BB:DD.F" as
 * cuDeviceGetPCIBusId writes it; any case, a domain of 4 or 8 hex digits) and
 * the RDMA device @ibdev (its name under class/infiniband), in the sysfs tree
 * at @root. Returns a drc__pci_path, -EINVAL for a malformed bus id or name,
 * or -ENOENT when either device is not in the tree (a NIC with no PCI device,
 * such as rxe, has no "device" link there).
 */
int drc__topo_path(const char *root, const char *gpu_bus_id, const char *ibdev);

enum drc__dmabuf_mapping {
    DRC__MAPPING_DEFAULT = 0,
    DRC__MAPPING_PCIE    = 1,
};

/*
 * The mapping type to ask for, for a pair whose path is @path (a
 * drc__topo_path() result, or its negative errno when the topology could not
 * be read: the default type then). @override is the user's choice: NULL,
 * "" or "auto" decide from the path; "pcie" and "default" force a type. An
 * unknown override is -EINVAL, so that a typo is reported, not ignored.
 */
int drc__topo_mapping(int path, const char *override);

/* "pcie" / "default": for the doctor and the logs. */
const char *drc__topo_mapping_name(int mapping);

#endif

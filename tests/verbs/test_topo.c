/*
 * Tests of src/verbs/topo.c: which dmabuf mapping type a (GPU, NIC) pair gets,
 * decided from machines laid out as sysfs trees in a temporary folder.
 *
 * What a user would check: a NIC under the GPU's PCIe switch gets the PCIe
 * mapping, a NIC reached through the CPU never does (the wrong type registers
 * fine and fails at transfer time), and an override says what it says.
 */
#include <errno.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "helpers.h"
#include "verbs/topo.h"

static char root[64];   /* short, so that every path built from it fits PATH_MAX */

/* A PCI device at devices/<chain> (e.g. "pci0000:00/0000:00:01.0/0000:01:00.0"), linked from bus/pci/devices. */
static void pci(const char *chain)
{
    assert_int_equal(fake_sysfs_pci(root, chain, NULL), 0);
}

/* An RDMA device @name whose PCI function is devices/<chain>. */
static void nic(const char *name, const char *chain)
{
    assert_int_equal(fake_sysfs_pci(root, chain, name), 0);
}

static int setup(void **state)
{
    (void)state;
    snprintf(root, sizeof(root), "/tmp/drc-topo-XXXXXX");
    assert_non_null(mkdtemp(root));
    return 0;
}

static int teardown(void **state)
{
    char cmd[PATH_MAX + 16];

    (void)state;
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
    return system(cmd) == 0 ? 0 : -1;
}

#define SW "pci0000:00/0000:00:01.0/0000:01:00.0"   /* root port, then a switch's upstream port */

/* A DGX-like node: per switch one GPU and two NICs; a second switch under another root port. */
static void test_nics_under_the_gpu_switch_get_pcie(void **state)
{
    (void)state;
    pci(SW "/0000:02:00.0/0000:03:00.0");                 /* GPU 0 */
    nic("mlx5_0", SW "/0000:02:01.0/0000:04:00.0");
    nic("mlx5_1", SW "/0000:02:02.0/0000:05:00.0");
    nic("mlx5_2", "pci0000:00/0000:00:02.0/0000:11:00.0/0000:12:00.0/0000:13:00.0");

    assert_int_equal(drc__topo_path(root, "0000:03:00.0", "mlx5_0"), DRC__PATH_SWITCH);
    assert_int_equal(drc__topo_path(root, "0000:03:00.0", "mlx5_1"), DRC__PATH_SWITCH);
    /* control: the NIC under the other root port goes through the CPU */
    assert_int_equal(drc__topo_path(root, "0000:03:00.0", "mlx5_2"), DRC__PATH_HOST);

    assert_int_equal(drc__topo_mapping(drc__topo_path(root, "0000:03:00.0", "mlx5_0"), NULL), DRC__MAPPING_PCIE);
    assert_int_equal(drc__topo_mapping(drc__topo_path(root, "0000:03:00.0", "mlx5_2"), NULL), DRC__MAPPING_DEFAULT);
}

/* Switches below switches (NCCL's PXB) are still one PCIe fabric without the host bridge. */
static void test_nested_switches_are_pcie(void **state)
{
    (void)state;
    pci(SW "/0000:02:00.0/0000:03:00.0/0000:04:00.0/0000:05:00.0");
    nic("mlx5_0", SW "/0000:02:08.0/0000:09:00.0");
    assert_int_equal(drc__topo_path(root, "0000:05:00.0", "mlx5_0"), DRC__PATH_SWITCH);
}

/* Different host bridges (another socket), or meeting only at the root port, is the CPU path. */
static void test_root_port_and_host_bridge_are_host(void **state)
{
    (void)state;
    pci("pci0000:00/0000:00:01.0/0000:01:00.0");                /* GPU right below a root port */
    nic("mlx5_0", "pci0000:00/0000:00:01.0/0000:01:00.1");      /* a function beside it */
    nic("mlx5_1", "pci0000:80/0000:80:01.0/0000:81:00.0");      /* the other socket */
    assert_int_equal(drc__topo_path(root, "0000:01:00.0", "mlx5_0"), DRC__PATH_HOST);
    assert_int_equal(drc__topo_path(root, "0000:01:00.0", "mlx5_1"), DRC__PATH_HOST);
}

/* cuDeviceGetPCIBusId's forms: upper case, an eight-digit domain. */
static void test_bus_id_forms(void **state)
{
    (void)state;
    pci(SW "/0000:02:00.0/0000:3b:00.0");
    nic("mlx5_0", SW "/0000:02:01.0/0000:3c:00.0");
    assert_int_equal(drc__topo_path(root, "0000:3B:00.0", "mlx5_0"), DRC__PATH_SWITCH);
    assert_int_equal(drc__topo_path(root, "00000000:3b:00.0", "mlx5_0"), DRC__PATH_SWITCH);
    assert_int_equal(drc__topo_path(root, "0000:3b:00", "mlx5_0"), -EINVAL);
    assert_int_equal(drc__topo_path(root, "0000:3b:00.0x", "mlx5_0"), -EINVAL);
    assert_int_equal(drc__topo_path(root, "0000:3b:00.0", "../mlx5_0"), -EINVAL);
    assert_int_equal(drc__topo_path(root, "0000:3b:00.0", ""), -EINVAL);
}

/* A software NIC (rxe, siw) has no PCI device; an absent GPU likewise: unknown, so the default type. */
static void test_missing_devices(void **state)
{
    char dir[PATH_MAX];

    (void)state;
    pci(SW "/0000:02:00.0/0000:03:00.0");
    snprintf(dir, sizeof(dir), "%s/class/infiniband/rxe0", root);
    mkdirs(dir);
    assert_int_equal(drc__topo_path(root, "0000:03:00.0", "rxe0"), -ENOENT);
    assert_int_equal(drc__topo_path(root, "0000:07:00.0", "rxe0"), -ENOENT);
    assert_int_equal(drc__topo_mapping(-ENOENT, NULL), DRC__MAPPING_DEFAULT);
}

static void test_override(void **state)
{
    (void)state;
    assert_int_equal(drc__topo_mapping(DRC__PATH_HOST, "pcie"), DRC__MAPPING_PCIE);
    assert_int_equal(drc__topo_mapping(DRC__PATH_SWITCH, "default"), DRC__MAPPING_DEFAULT);
    assert_int_equal(drc__topo_mapping(DRC__PATH_SWITCH, "auto"), DRC__MAPPING_PCIE);
    assert_int_equal(drc__topo_mapping(DRC__PATH_SWITCH, ""), DRC__MAPPING_PCIE);
    assert_int_equal(drc__topo_mapping(DRC__PATH_SWITCH, "PCIe!"), -EINVAL);
    assert_string_equal(drc__topo_mapping_name(DRC__MAPPING_PCIE), "pcie");
    assert_string_equal(drc__topo_mapping_name(DRC__MAPPING_DEFAULT), "default");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_nics_under_the_gpu_switch_get_pcie, setup, teardown),
        cmocka_unit_test_setup_teardown(test_nested_switches_are_pcie, setup, teardown),
        cmocka_unit_test_setup_teardown(test_root_port_and_host_bridge_are_host, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bus_id_forms, setup, teardown),
        cmocka_unit_test_setup_teardown(test_missing_devices, setup, teardown),
        cmocka_unit_test(test_override),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

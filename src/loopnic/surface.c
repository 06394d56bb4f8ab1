/* loopnic: the rest of rdma-core's libibverbs.so.1 symbol surface (loopnic.map).
 *
 * A program, librdmacm or a provider library (libmlx5, libefa: perftest links both) that was linked
 * against rdma-core's libibverbs refers to these names with their version nodes; with BIND_NOW (how
 * Debian builds) a single missing one stops the program before main. What the model does not
 * implement is here and fails at call time as a real provider does for an unsupported feature:
 * EOPNOTSUPP (or NULL with errno EOPNOTSUPP); it never pretends to succeed.
 *
 *  - the kernel-ABI copy helpers librdmacm uses (ibv_copy_*_from_kern, *_to_kern): implemented, they
 *    are plain field copies between the kernel's structures and the verbs ones;
 *  - sysfs helpers: implemented over the real file system (the model's devices have no sysfs, so
 *    reading their files fails as for a missing attribute);
 *  - IBVERBS_PRIVATE_34, the interface between libibverbs and its provider libraries: a provider
 *    library loaded next to the model registers nothing (verbs_register_driver_34 ignores it), so
 *    its code is never reached through the model's devices; the ibv_cmd_* kernel commands fail;
 *  - the IBVERBS_1.0 compatibility versions (the libibverbs 1.0 ABI, for binaries of 2007): fail.
 */
#include <infiniband/verbs.h>
#include <infiniband/sa.h>
#include <rdma/ib_user_sa.h>
#include <rdma/ib_user_verbs.h>

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define API __attribute__((visibility("default")))

/* ---- IBVERBS_1.0 / 1.1: sysfs and the kernel-ABI copies ---- */
API const char *ibv_get_sysfs_path(void)
{
    return "/sys";
}

API int ibv_read_sysfs_file(const char *dir, const char *file, char *buf, size_t size)
{
    char path[4096];
    ssize_t n;
    int fd;

    if (snprintf(path, sizeof(path), "%s/%s", dir, file) >= (int)sizeof(path)) {
        errno = ENAMETOOLONG;
        return -1;
    }
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    n = read(fd, buf, size);
    close(fd);
    if (n <= 0)
        return -1;
    if ((size_t)n == size)
        n--;
    buf[n] = '\0';
    if (n > 0 && buf[n - 1] == '\n')
        buf[--n] = '\0';
    return (int)n;
}

API void ibv_copy_ah_attr_from_kern(struct ibv_ah_attr *dst, struct ib_uverbs_ah_attr *src)
{
    memcpy(dst->grh.dgid.raw, src->grh.dgid, sizeof(dst->grh.dgid));
    dst->grh.flow_label = src->grh.flow_label;
    dst->grh.sgid_index = src->grh.sgid_index;
    dst->grh.hop_limit = src->grh.hop_limit;
    dst->grh.traffic_class = src->grh.traffic_class;
    dst->dlid = src->dlid;
    dst->sl = src->sl;
    dst->src_path_bits = src->src_path_bits;
    dst->static_rate = src->static_rate;
    dst->is_global = src->is_global;
    dst->port_num = src->port_num;
}

API void ibv_copy_qp_attr_from_kern(struct ibv_qp_attr *dst, struct ib_uverbs_qp_attr *src)
{
    dst->cur_qp_state = src->cur_qp_state;
    dst->path_mtu = src->path_mtu;
    dst->path_mig_state = src->path_mig_state;
    dst->qkey = src->qkey;
    dst->rq_psn = src->rq_psn;
    dst->sq_psn = src->sq_psn;
    dst->dest_qp_num = src->dest_qp_num;
    dst->qp_access_flags = src->qp_access_flags;
    dst->cap.max_send_wr = src->max_send_wr;
    dst->cap.max_recv_wr = src->max_recv_wr;
    dst->cap.max_send_sge = src->max_send_sge;
    dst->cap.max_recv_sge = src->max_recv_sge;
    dst->cap.max_inline_data = src->max_inline_data;
    ibv_copy_ah_attr_from_kern(&dst->ah_attr, &src->ah_attr);
    ibv_copy_ah_attr_from_kern(&dst->alt_ah_attr, &src->alt_ah_attr);
    dst->pkey_index = src->pkey_index;
    dst->alt_pkey_index = src->alt_pkey_index;
    dst->en_sqd_async_notify = src->en_sqd_async_notify;
    dst->sq_draining = src->sq_draining;
    dst->max_rd_atomic = src->max_rd_atomic;
    dst->max_dest_rd_atomic = src->max_dest_rd_atomic;
    dst->min_rnr_timer = src->min_rnr_timer;
    dst->port_num = src->port_num;
    dst->timeout = src->timeout;
    dst->retry_cnt = src->retry_cnt;
    dst->rnr_retry = src->rnr_retry;
    dst->alt_port_num = src->alt_port_num;
    dst->alt_timeout = src->alt_timeout;
}

API void ibv_copy_path_rec_from_kern(struct ibv_sa_path_rec *dst, struct ib_user_path_rec *src)
{
    memcpy(dst->dgid.raw, src->dgid, sizeof(dst->dgid));
    memcpy(dst->sgid.raw, src->sgid, sizeof(dst->sgid));
    dst->dlid = src->dlid;
    dst->slid = src->slid;
    dst->raw_traffic = (int)src->raw_traffic;
    dst->flow_label = src->flow_label;
    dst->reversible = (int)src->reversible;
    dst->mtu = (uint8_t)src->mtu;
    dst->pkey = src->pkey;
    dst->hop_limit = src->hop_limit;
    dst->traffic_class = src->traffic_class;
    dst->numb_path = src->numb_path;
    dst->sl = src->sl;
    dst->mtu_selector = src->mtu_selector;
    dst->rate_selector = src->rate_selector;
    dst->rate = src->rate;
    dst->packet_life_time_selector = src->packet_life_time_selector;
    dst->packet_life_time = src->packet_life_time;
    dst->preference = src->preference;
}

API void ibv_copy_path_rec_to_kern(struct ib_user_path_rec *dst, struct ibv_sa_path_rec *src)
{
    memcpy(dst->dgid, src->dgid.raw, sizeof(dst->dgid));
    memcpy(dst->sgid, src->sgid.raw, sizeof(dst->sgid));
    dst->dlid = src->dlid;
    dst->slid = src->slid;
    dst->raw_traffic = (uint32_t)src->raw_traffic;
    dst->flow_label = src->flow_label;
    dst->reversible = (uint32_t)src->reversible;
    dst->mtu = src->mtu;
    dst->pkey = src->pkey;
    dst->hop_limit = src->hop_limit;
    dst->traffic_class = src->traffic_class;
    dst->numb_path = src->numb_path;
    dst->sl = src->sl;
    dst->mtu_selector = src->mtu_selector;
    dst->rate_selector = src->rate_selector;
    dst->rate = src->rate;
    dst->packet_life_time_selector = src->packet_life_time_selector;
    dst->packet_life_time = src->packet_life_time;
    dst->preference = src->preference;
}

/* ---- features the model does not have ---- */
API int ibv_attach_mcast(struct ibv_qp *qp, const union ibv_gid *gid, uint16_t lid)
{
    (void)qp; (void)gid; (void)lid;
    return EOPNOTSUPP;
}

API int ibv_detach_mcast(struct ibv_qp *qp, const union ibv_gid *gid, uint16_t lid)
{
    (void)qp; (void)gid; (void)lid;
    return EOPNOTSUPP;
}

API int ibv_resolve_eth_l2_from_gid(struct ibv_context *context, struct ibv_ah_attr *attr,
                                    uint8_t eth_mac[6], uint16_t *vid)
{
    (void)context; (void)attr; (void)eth_mac; (void)vid;
    return EOPNOTSUPP;
}

API struct ibv_context *ibv_import_device(int cmd_fd)
{
    (void)cmd_fd;
    errno = EOPNOTSUPP;
    return NULL;
}

API struct ibv_pd *ibv_import_pd(struct ibv_context *context, uint32_t pd_handle)
{
    (void)context; (void)pd_handle;
    errno = EOPNOTSUPP;
    return NULL;
}

API void ibv_unimport_pd(struct ibv_pd *pd)
{
    (void)pd;
}

API struct ibv_mr *ibv_import_mr(struct ibv_pd *pd, uint32_t mr_handle)
{
    (void)pd; (void)mr_handle;
    errno = EOPNOTSUPP;
    return NULL;
}

API void ibv_unimport_mr(struct ibv_mr *mr)
{
    (void)mr;
}

API struct ibv_dm *ibv_import_dm(struct ibv_context *context, uint32_t dm_handle)
{
    (void)context; (void)dm_handle;
    errno = EOPNOTSUPP;
    return NULL;
}

API void ibv_unimport_dm(struct ibv_dm *dm)
{
    (void)dm;
}

API int ibv_set_ece(struct ibv_qp *qp, struct ibv_ece *ece)
{
    (void)qp; (void)ece;
    return EOPNOTSUPP;
}

API int ibv_query_ece(struct ibv_qp *qp, struct ibv_ece *ece)
{
    (void)qp; (void)ece;
    return EOPNOTSUPP;
}

/* ---- IBVERBS_PRIVATE_34: libibverbs' interface to its provider libraries ---- */
API bool verbs_allow_disassociate_destroy;

API void verbs_register_driver_34(const void *ops)
{
    (void)ops; /* a provider library's devices are not the model's: nothing to register */
}

API void verbs_set_ops(void *vctx, const void *ops)
{
    (void)vctx; (void)ops;
}

API void verbs_uninit_context(void *vctx)
{
    (void)vctx;
}

API void *_verbs_init_and_alloc_context(void *device, int cmd_fd, size_t alloc_size, void *context_offset,
                                        uint32_t driver_id)
{
    (void)device; (void)cmd_fd; (void)alloc_size; (void)context_offset; (void)driver_id;
    errno = EOPNOTSUPP;
    return NULL;
}

API void *verbs_open_device(void *device, void *private_data)
{
    (void)device; (void)private_data;
    errno = EOPNOTSUPP;
    return NULL;
}

API int verbs_init_cq(void *cq, void *context, void *channel, void *cq_context)
{
    (void)cq; (void)context; (void)channel; (void)cq_context;
    return EOPNOTSUPP;
}

API void __verbs_log(void *ctx, uint32_t level, const char *fmt, ...)
{
    (void)ctx; (void)level; (void)fmt;
}

API unsigned int __ioctl_final_num_attrs(unsigned int num_attrs, void *link)
{
    (void)link;
    return num_attrs;
}

API int execute_ioctl(void *context, void *cmd)
{
    (void)context; (void)cmd;
    return EOPNOTSUPP;
}

API int ibv_read_ibdev_sysfs_file(char *buf, size_t size, void *sysfs_dev, const char *fnfmt, ...)
{
    (void)buf; (void)size; (void)sysfs_dev; (void)fnfmt;
    errno = ENOENT;
    return -1;
}

/* The kernel commands: every ibv_cmd_* returns an errno. */
#define CMD(name) \
    API int name(void) { return EOPNOTSUPP; }
CMD(ibv_cmd_advise_mr) CMD(ibv_cmd_alloc_dm) CMD(ibv_cmd_alloc_mw) CMD(ibv_cmd_alloc_pd)
CMD(ibv_cmd_attach_mcast) CMD(ibv_cmd_close_xrcd) CMD(ibv_cmd_create_ah) CMD(ibv_cmd_create_counters)
CMD(ibv_cmd_create_cq) CMD(ibv_cmd_create_cq_ex) CMD(ibv_cmd_create_flow) CMD(ibv_cmd_create_flow_action_esp)
CMD(ibv_cmd_create_qp) CMD(ibv_cmd_create_qp_ex) CMD(ibv_cmd_create_qp_ex2) CMD(ibv_cmd_create_rwq_ind_table)
CMD(ibv_cmd_create_srq) CMD(ibv_cmd_create_srq_ex) CMD(ibv_cmd_create_wq) CMD(ibv_cmd_dealloc_mw)
CMD(ibv_cmd_dealloc_pd) CMD(ibv_cmd_dereg_mr) CMD(ibv_cmd_destroy_ah) CMD(ibv_cmd_destroy_counters)
CMD(ibv_cmd_destroy_cq) CMD(ibv_cmd_destroy_flow) CMD(ibv_cmd_destroy_flow_action) CMD(ibv_cmd_destroy_qp)
CMD(ibv_cmd_destroy_rwq_ind_table) CMD(ibv_cmd_destroy_srq) CMD(ibv_cmd_destroy_wq) CMD(ibv_cmd_detach_mcast)
CMD(ibv_cmd_free_dm) CMD(ibv_cmd_get_context) CMD(ibv_cmd_modify_cq) CMD(ibv_cmd_modify_flow_action_esp)
CMD(ibv_cmd_modify_qp) CMD(ibv_cmd_modify_qp_ex) CMD(ibv_cmd_modify_srq) CMD(ibv_cmd_modify_wq)
CMD(ibv_cmd_open_qp) CMD(ibv_cmd_open_xrcd) CMD(ibv_cmd_poll_cq) CMD(ibv_cmd_post_recv) CMD(ibv_cmd_post_send)
CMD(ibv_cmd_post_srq_recv) CMD(ibv_cmd_query_context) CMD(ibv_cmd_query_device_any) CMD(ibv_cmd_query_mr)
CMD(ibv_cmd_query_port) CMD(ibv_cmd_query_qp) CMD(ibv_cmd_query_srq) CMD(ibv_cmd_read_counters)
CMD(ibv_cmd_reg_dm_mr) CMD(ibv_cmd_reg_dmabuf_mr) CMD(ibv_cmd_reg_mr) CMD(ibv_cmd_req_notify_cq)
CMD(ibv_cmd_rereg_mr) CMD(ibv_cmd_resize_cq)

/* ---- the IBVERBS_1.0 compatibility versions (non-default: only binaries linked against the 1.0
 * ABI bind them). The 1.0 structures differ from today's; the model does not translate them. ---- */
#define COMPAT_PTR(name) \
    void *compat_##name(void); \
    API void *compat_##name(void) { errno = ENOSYS; return NULL; } \
    __asm__(".symver compat_" #name "," #name "@IBVERBS_1.0");
#define COMPAT_INT(name) \
    int compat_##name(void); \
    API int compat_##name(void) { errno = ENOSYS; return ENOSYS; } \
    __asm__(".symver compat_" #name "," #name "@IBVERBS_1.0");
#define COMPAT_VOID(name) \
    void compat_##name(void); \
    API void compat_##name(void) {} \
    __asm__(".symver compat_" #name "," #name "@IBVERBS_1.0");
COMPAT_PTR(ibv_get_device_list) COMPAT_PTR(ibv_get_device_name) COMPAT_PTR(ibv_open_device)
COMPAT_PTR(ibv_alloc_pd) COMPAT_PTR(ibv_reg_mr) COMPAT_PTR(ibv_create_cq) COMPAT_PTR(ibv_create_srq)
COMPAT_PTR(ibv_create_qp) COMPAT_PTR(ibv_create_ah)
COMPAT_VOID(ibv_free_device_list) COMPAT_VOID(ibv_ack_async_event) COMPAT_VOID(ibv_ack_cq_events)
COMPAT_INT(ibv_get_device_guid) COMPAT_INT(ibv_close_device) COMPAT_INT(ibv_get_async_event)
COMPAT_INT(ibv_query_device) COMPAT_INT(ibv_query_port) COMPAT_INT(ibv_query_gid) COMPAT_INT(ibv_query_pkey)
COMPAT_INT(ibv_dealloc_pd) COMPAT_INT(ibv_dereg_mr) COMPAT_INT(ibv_get_cq_event) COMPAT_INT(ibv_resize_cq)
COMPAT_INT(ibv_destroy_cq) COMPAT_INT(ibv_modify_srq) COMPAT_INT(ibv_query_srq) COMPAT_INT(ibv_destroy_srq)
COMPAT_INT(ibv_query_qp) COMPAT_INT(ibv_modify_qp) COMPAT_INT(ibv_destroy_qp) COMPAT_INT(ibv_destroy_ah)
COMPAT_INT(ibv_attach_mcast) COMPAT_INT(ibv_detach_mcast)

/* IBVERBS_1.1's non-default ibv_register_driver: the pre-34 way for a provider to register */
void compat_ibv_register_driver(void);
API void compat_ibv_register_driver(void) {}
__asm__(".symver compat_ibv_register_driver,ibv_register_driver@IBVERBS_1.1");

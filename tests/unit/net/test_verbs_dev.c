/* The NET contract (net_contract.h) on a real RDMA device through the verbs backend: both
 * "nodes" open the same device (PF_VERBS_NIC, else the first one listed) and connect RC QPs
 * through its active port (loopback); with PF_VERBS_NIC_B the second node opens that device
 * instead, so READs cross a link (rxe0 -> rxe1 over the veth pair in ci/rxe-vm.sh). Needs an RDMA
 * device (mlx5, or soft-RoCE made by ci/rxe-setup.sh); exits 77 with a SKIP line where there is
 * none, as on our VMs. */
#include <signal.h>

#include "net_contract.h"

#if __has_include(<infiniband/verbs.h>)
#include "../../../hw/verbs/verbs_internal.h"
#pragma weak pf_verbs_real_api
#define HAVE_IBV_HEADERS 1
#else
#define HAVE_IBV_HEADERS 0
#endif

static char devname[64], devname_b[64];

int main(void)
{
#if HAVE_IBV_HEADERS
    int (*volatile reg)(void) = pf_verbs_register; /* pulls in verbs.c or verbs_absent.c */
    (void)reg;
    if (!&pf_verbs_real_api) {
        printf("SKIP: verbs backend not compiled (configure found no libibverbs)\n");
        return 77;
    }
    int n = 0;
    errno = 0;
    struct ibv_device **l = pf_verbs_real_api.get_device_list(&n);
    int e = errno;
    const char *want = getenv("PF_VERBS_NIC");
    if (!l || n <= 0) {
        printf("SKIP: no RDMA device (ibv_get_device_list: %s); `make test-rxe` runs this "
               "test over soft-RoCE in a qemu guest (ci/rxe-vm.sh), or set PF_VERBS_NIC on a "
               "host with mlx5\n",
               l   ? "empty list"
               : e ? strerror(e)
                   : "NULL");
        if (l)
            pf_verbs_real_api.free_device_list(l);
        return 77;
    }
    snprintf(devname, sizeof(devname), "%s", want ? want : pf_verbs_real_api.get_device_name(l[0]));
    const char *want_b = getenv("PF_VERBS_NIC_B");
    snprintf(devname_b, sizeof(devname_b), "%s", want_b && *want_b ? want_b : devname);
    pf_verbs_real_api.free_device_list(l);
    signal(SIGPIPE, SIG_IGN);
    nc_backend = "verbs";
    nc_nics_a[0] = devname;
    nc_nics_b[0] = devname_b;
    nc_seed_init();
    fprintf(stderr, "verbs devices: holder %s, requester %s\n", devname, devname_b);
    const struct CMUnitTest tests[] = {NC_CONTRACT_TESTS};
    return cmocka_run_group_tests(tests, NULL, NULL);
#else
    printf("SKIP: rdma-core headers (infiniband/verbs.h) not installed\n");
    return 77;
#endif
}

/* Fault injection plan, shared by the faulty:<inner> decorators of every HAL class.
 *
 * Spec: clauses separated by ';', each "op:key=value,key=value" or "seed=N".
 *   op     gpu.d2h gpu.h2d gpu.ipc_open gpu.host_register gpu.sync
 *          net.read net.connect net.reg_mem   blk.write blk.read blk.open
 *          engine.seal (delay=MS only: the insert thread waits that long before it seals
 *          each batch of saved slots, so saved blocks become queryable later; tests use it
 *          to find code that assumes a Save's blocks are visible the moment it returns)
 *          or a prefix wildcard such as "gpu.*" / "blk.*".
 *   prob=P     fire with probability P on each eligible call (default 1)
 *   nth=K      calls before the K-th are not eligible (default 1)
 *   times=T    fire at most T times (default 1 when nth is given without prob, else unlimited)
 *   error=E    errno name or number to fail with (default EIO when no other action is given)
 *   at=post|complete   fail when the op is submitted (default) or when it completes
 *   delay=MS   add MS milliseconds of latency, then proceed (with the other actions)
 *   corrupt=1  flip payload bytes of the transferred data
 *   drop=1     never complete the operation
 *   fatal=1    the device is unusable from now on: every later op of the class fails (EIO)
 * Example: "seed=7;net.read:prob=0.05,error=EIO;blk.write:nth=3,error=ENOSPC".
 *
 * The RNG is seeded from the spec's seed, else PEGAFLOW_FAULT_SEED, else the clock; the
 * seed is logged so a failure replays. Each fired fault increments
 * pegaflow_faults_injected_total{op,kind}. Thread-safe. */
#ifndef PF_FAULT_H
#define PF_FAULT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct pf_fault_plan;

struct pf_fault_hit {
    int error;        /* -errno to return, 0 = none */
    bool at_complete; /* report error at completion instead of submission */
    uint64_t delay_ms;
    uint64_t stall_ms; /* net.read: the post blocks this long before it submits */
    bool corrupt;
    bool drop;
    bool fatal;
};

/* Parses spec. Returns 0 or -EINVAL with a one-line message in err. */
int pf_fault_plan_parse(const char *spec, struct pf_fault_plan **plan_p, char *err, size_t errlen);
void pf_fault_plan_free(struct pf_fault_plan *p);
uint64_t pf_fault_plan_seed(const struct pf_fault_plan *p);
const char *pf_fault_plan_spec(const struct pf_fault_plan *p);
/* True when some rule names this class ("gpu", "net", "blk"). */
bool pf_fault_plan_covers(const struct pf_fault_plan *p, const char *cls);

/* Decides whether a call of op fires a fault. Fills *hit (zeroed when nothing fires) and
 * returns true when something fires. A NULL plan never fires. */
bool pf_fault_check(struct pf_fault_plan *p, const char *op, struct pf_fault_hit *hit);
/* Flips a few bytes of buf deterministically from the plan's RNG. */
void pf_fault_corrupt(struct pf_fault_plan *p, void *buf, size_t len);
/* Total faults fired so far by this plan (all rules). */
uint64_t pf_fault_fired(const struct pf_fault_plan *p);

#endif

/* Fault-contained copies (see pf/guard.h). A thread-local jump buffer is armed around the
 * memcpy; the SIGBUS/SIGSEGV handler jumps back when the fault happened on a thread with an
 * armed buffer and chains to the previous disposition otherwise. The handler is installed
 * with SA_NODEFER so the signal is not left blocked after the jump (sigsetjmp then need
 * not save the mask, which keeps a guarded copy free of system calls). */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>

#include "pf/guard.h"

static _Thread_local sigjmp_buf *guard_jmp;
static struct sigaction prev_bus, prev_segv;
static pthread_once_t guard_once = PTHREAD_ONCE_INIT;
static int guard_rc;

static void chain(int sig, siginfo_t *si, void *uc)
{
    struct sigaction *p = sig == SIGBUS ? &prev_bus : &prev_segv;
    if (p->sa_flags & SA_SIGINFO) {
        if (p->sa_sigaction) {
            p->sa_sigaction(sig, si, uc);
            return;
        }
    } else if (p->sa_handler != SIG_DFL && p->sa_handler != SIG_IGN) {
        p->sa_handler(sig);
        return;
    }
    /* default action: restore it and return; the faulting instruction runs again and the
     * process dies with the usual signal */
    signal(sig, SIG_DFL);
}

static void on_fault(int sig, siginfo_t *si, void *uc)
{
    sigjmp_buf *j = guard_jmp;
    if (j) {
        guard_jmp = NULL;
        siglongjmp(*j, 1);
    }
    chain(sig, si, uc);
}

static void install(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = on_fault;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGBUS, &sa, &prev_bus) != 0 || sigaction(SIGSEGV, &sa, &prev_segv) != 0)
        guard_rc = -errno;
}

int pf_guard_init(void)
{
    pthread_once(&guard_once, install);
    return guard_rc;
}

int pf_guard_copy(void *dst, const void *src, size_t len)
{
    sigjmp_buf jb;
    /* volatile: read after a jump back */
    volatile int faulted = 0;
    if (sigsetjmp(jb, 0) != 0) {
        faulted = 1;
    } else {
        guard_jmp = &jb;
        atomic_signal_fence(memory_order_seq_cst);
        memcpy(dst, src, len);
        atomic_signal_fence(memory_order_seq_cst);
    }
    guard_jmp = NULL;
    return faulted ? -EFAULT : 0;
}

int pf_guard_call(void (*fn)(void *arg), void *arg)
{
    sigjmp_buf jb;
    volatile int faulted = 0;
    if (sigsetjmp(jb, 0) != 0) {
        faulted = 1;
    } else {
        guard_jmp = &jb;
        atomic_signal_fence(memory_order_seq_cst);
        fn(arg);
        atomic_signal_fence(memory_order_seq_cst);
    }
    guard_jmp = NULL;
    return faulted ? -EFAULT : 0;
}

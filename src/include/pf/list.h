/* Intrusive circular doubly linked list (Linux-style). Not thread-safe: callers lock. */
#ifndef PF_LIST_H
#define PF_LIST_H

#include <stdbool.h>
#include <stddef.h>
#include "pf/common.h"

struct pf_list {
    struct pf_list *next, *prev;
};

#define PF_LIST_INIT(name)                                                                         \
    {                                                                                              \
        &(name), &(name)                                                                           \
    }

static inline void pf_list_init(struct pf_list *h)
{
    h->next = h->prev = h;
}
static inline bool pf_list_empty(const struct pf_list *h)
{
    return h->next == h;
}
static inline void pf_list_insert_(struct pf_list *n, struct pf_list *prev, struct pf_list *next)
{
    next->prev = n;
    n->next = next;
    n->prev = prev;
    prev->next = n;
}
/* Insert at the head (most recent end when used as LRU). */
static inline void pf_list_add(struct pf_list *h, struct pf_list *n)
{
    pf_list_insert_(n, h, h->next);
}
/* Insert at the tail. */
static inline void pf_list_add_tail(struct pf_list *h, struct pf_list *n)
{
    pf_list_insert_(n, h->prev, h);
}
static inline void pf_list_del(struct pf_list *n)
{
    n->next->prev = n->prev;
    n->prev->next = n->next;
    n->next = n->prev = n;
}
static inline bool pf_list_linked(const struct pf_list *n)
{
    return n->next != n;
}
static inline void pf_list_move(struct pf_list *h, struct pf_list *n)
{
    pf_list_del(n);
    pf_list_add(h, n);
}
static inline void pf_list_move_tail(struct pf_list *h, struct pf_list *n)
{
    pf_list_del(n);
    pf_list_add_tail(h, n);
}

#define pf_list_entry(ptr, type, member) pf_container_of(ptr, type, member)
#define pf_list_first(h, type, member)                                                             \
    (pf_list_empty(h) ? NULL : pf_list_entry((h)->next, type, member))
#define pf_list_last(h, type, member)                                                              \
    (pf_list_empty(h) ? NULL : pf_list_entry((h)->prev, type, member))
#define pf_list_for_each_safe(pos, tmp, h)                                                         \
    for (pos = (h)->next, tmp = pos->next; pos != (h); pos = tmp, tmp = pos->next)

#endif

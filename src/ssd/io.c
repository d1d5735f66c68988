/* One block transfer through a BLK queue: a vectored read or write split into parts of at
 * most SSD_IOV_MAX segments at consecutive file offsets. Parts are submitted in order; a
 * full queue (-EAGAIN) leaves the rest for the next call, any other submission error ends
 * the transfer (parts already submitted still complete and are counted). */
#include <errno.h>

#include "ssd/ssd_internal.h"

int ssd_io_submit(struct pf_blk_queue *q, struct ssd_io *io)
{
    while (!io->err && io->submitted < io->nparts) {
        uint32_t p = io->submitted;
        int first = (int)p * SSD_IOV_MAX;
        int cnt = io->niov - first < SSD_IOV_MAX ? io->niov - first : SSD_IOV_MAX;
        uint64_t tag = io->id << SSD_TAG_SHIFT | p;
        int rc = pf_blk_submit(q, io->file, io->op, io->next_off, io->iov + first, cnt, tag);
        if (rc == -EAGAIN)
            return 0;
        if (rc) {
            io->err = rc;
            return rc;
        }
        for (int i = 0; i < cnt; i++)
            io->next_off += io->iov[first + i].iov_len;
        io->submitted++;
    }
    return 0;
}

void ssd_io_complete(struct ssd_io *io, int64_t res)
{
    io->completed++;
    if (res < 0) {
        if (!io->err)
            io->err = (int)res;
    } else {
        io->bytes += (uint64_t)res;
    }
}

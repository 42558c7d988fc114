/*
 * ext.h — state a module keeps on the runtime or on a session without the
 * holder knowing its layout. Not ABI.
 *
 * The runtime (runtime.h) and every session (session_state.h) hold one slot per
 * module that needs one. The module allocates its state on first use, puts
 * it in its slot with the hook that frees it, and reads it back through its
 * own accessor; the holder only calls the hooks when it goes away. So the
 * speculative state (spec.c) and the draft head (draft_head.c) change shape
 * without touching session.c or forward.c.
 */
#ifndef LS_EXT_H
#define LS_EXT_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    void *state;              /* NULL until the module first needs it */
    void (*free)(void *state); /* how the module frees it */
} ls_ext;

/* Slots of the runtime, one per module. */
enum { LS_RUNTIME_EXT_DRAFT_HEAD, LS_RUNTIME_EXT_BATCH, LS_RUNTIME_EXT_N };

/* Slots of a session, one per module. */
enum { LS_SESSION_EXT_SPEC, LS_SESSION_EXT_N };

/* Frees the state of every slot (the holder is going away) and empties them. */
static inline void ls_ext_free_all(ls_ext *slots, int32_t n) {
    for (int32_t i = 0; i < n; i++) {
        if (slots[i].state) slots[i].free(slots[i].state);
        slots[i].state = NULL;
        slots[i].free = NULL;
    }
}

#endif

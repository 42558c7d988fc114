/*
 * sizes.h — the sizes both libraries work in, written once: the CPU
 * library and the CUDA one split calls and size their scratch and rings by
 * them, and so does the code they share (model.c's activation scratch,
 * session_rules.h's checks). Not ABI (loopserve.h holds the numbers a
 * caller sees).
 */
#ifndef LS_SIZES_H
#define LS_SIZES_H

/* Largest number of tokens pushed through the block in one internal step.
 * Longer calls are split; batch invariance makes the split invisible. It
 * bounds a chunk's scratch and the ring: a windowed cache holds
 * window + LS_CHUNK positions (session_rules.h ls_ring_rows). */
#define LS_CHUNK 64

/* Most cache units (steps x layers) one session may hold. */
#define LS_MAX_UNITS 65536

#endif

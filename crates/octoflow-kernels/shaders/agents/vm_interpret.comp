#version 450
// Phase 1 of an agent VM step (docs/VM.md, "A step"; octoflow_agents::interp is the reference):
// one invocation per instance executes instructions until one yields, at most BUDGET of them.
//
// Two passes of this shader make the phase (push constant `pass`): pass 0 snapshots what every
// queue and mailbox holds as the step begins (Q_VISIBLE, B_VISIBLE) and clears H_CHANGED; pass
// 1 interprets. Reads see the snapshot, so what an instance writes this step is seen from the
// next, whatever order the invocations run in. Writes that several instances may race for are
// lock-free and never wait for another workgroup: `take` and `push` claim an index with a
// compare-and-swap loop on the queue's counter, `send` claims its slot with a compare-and-swap,
// `gen` bumps the arena with a compare-and-swap loop, events take a ring index with an atomic
// add. A racing reader may see a slot's or a close's step stamp half written: stamps start at
// u64::MAX, so any mix of old and new words reads as "not before this step", which is right.
#extension GL_GOOGLE_include_directive : require

#include "layout.glsl"

// One invocation per instance; the workgroup size is specialization constant 0
// (octoflow_kernels::agents::vm_local: VM_LOCAL, or CPU_LOCAL on a CPU driver).
layout(local_size_x_id = 0) in;

#include "common.glsl"

layout(std430, binding = 0) coherent buffer Hdr { uint hdr[]; };
layout(std430, binding = 1) readonly buffer Prog { uint prog[]; };
layout(std430, binding = 2) buffer Inst { uint inst[]; };
layout(std430, binding = 3) coherent buffer Arena { uint arena[]; };
layout(std430, binding = 4) readonly buffer Tables { uint tables[]; };
layout(std430, binding = 5) coherent buffer Queues { uint queues[]; };
layout(std430, binding = 6) coherent buffer Boxes { uint boxes[]; };
layout(std430, binding = 7) coherent buffer Events { uint events[]; };

layout(push_constant) uniform Push {
    uint pass; // 0: snapshot queues and mailboxes, 1: interpret
} pc;

#include "vm.glsl"

// How execution goes on after one instruction.
const uint FLOW_NEXT = 0u;
const uint FLOW_JUMP = 1u;
const uint FLOW_YIELD = 2u;
const uint FLOW_BLOCK = 3u;
const uint FLOW_HALT = 4u;
const uint FLOW_FAULT = 5u;

// Every function here has one `return`, at its end, and loops end by their condition: the
// structured form every driver compiles alike.

// Set by an instruction that jumps or faults.
uint g_target;
uint g_fault;
uint g_arg0;
uint g_arg1;

uint fault(uint code, uint arg0, uint arg1) {
    g_fault = code;
    g_arg0 = arg0;
    g_arg1 = arg1;
    return FLOW_FAULT;
}

uint atomic_load(uint at) {
    return atomicAdd(queues[at], 0u);
}

// ---- events ----

// A fresh ring record, or NONE when the ring is full (counted in H_EV_LOST).
uint event_record() {
    uint k = atomicAdd(hdr[H_EV_HEAD], 1u);
    uint cap = hdr[H_EV_CAP];
    uint e = NONE;
    if (cap == 0u || k - hdr[H_EV_READ] >= cap) {
        atomicAdd(hdr[H_EV_LOST], 1u);
    } else {
        e = (k % cap) * EVENT_WORDS;
    }
    return e;
}

void fail(uint code, uint arg0, uint arg1) {
    inst[B + I_STATUS] = ST_ERROR;
    uint e = event_record();
    if (e != NONE) {
        events[e + E_KIND] = EV_ERROR;
        events[e + E_INSTANCE] = inst[B + I_ID];
        events[e + E_CODE] = code;
        events[e + E_PC] = inst[B + I_PC];
        events[e + E_ARG0] = arg0;
        events[e + E_ARG1] = arg1;
        for (uint w = E_ARG1 + 1u; w < EVENT_WORDS; w++) {
            events[e + w] = 0u;
        }
    }
}

// ---- operands ----

uint finish_code(uint finish) {
    return finish == FIN_NONE ? 0u : (finish == FIN_EOG || finish == FIN_STOP) ? 1u : 2u;
}

uint special(uint s) {
    bool last = inst[B + I_HAS_LAST] != 0u;
    uint v = 0u;
    if (s == SP_ID) {
        v = inst[B + I_ID];
    } else if (s == SP_N) {
        v = hdr[H_N];
    } else if (s == SP_TASK) {
        v = inst[B + I_TASK];
    } else if (s == SP_PARENT) {
        v = inst[B + I_PARENT];
    } else if (s == SP_TASKS) {
        v = hdr[H_TASKS];
    } else if (s == SP_MAX) {
        v = hdr[H_MAX];
    } else if (s == SP_ROUNDS) {
        v = hdr[H_ROUNDS];
    } else if (s == SP_LEN) {
        v = last ? inst[B + I_LAST_LEN] : 0u;
    } else if (s == SP_FINISH) {
        v = last ? finish_code(inst[B + I_LAST_FINISH]) : 0u;
    } else if (s == SP_POS) {
        v = inst[B + I_POS] + inst[B + I_HAS_PENDING];
    } else if (s == SP_STOP) {
        v = last ? inst[B + I_LAST_STOP] : 0u;
    }
    return v;
}

uint val(uint kind, uint w) {
    uint v = w;
    if (kind == K_REG) {
        v = inst[B + I_REGS + (w & (N_REGS - 1u))];
    } else if (kind != K_IMM) {
        v = special(w);
    }
    return v;
}

// A destination register (the decoder only lets registers fill one; anything else is r0, as
// on the host).
uint dest(uint kind, uint w) {
    return I_REGS + (kind == K_REG ? (w & (N_REGS - 1u)) : 0u);
}

uint imm(uint kind, uint w) {
    return kind == K_IMM ? w : 0u;
}

void clear_presample() {
    inst[B + I_HAS_PRESAMPLE] = 0u;
    inst[B + I_PRE_TOKEN] = 0u;
    inst[B + I_PRE_LOGPROB] = 0u;
}

// ---- feeding and generating ----

// Starts feeding the pending token and `len` arena tokens at `offset`.
uint start_append(uint offset, uint len) {
    uint pend = inst[B + I_HAS_PENDING];
    uint pos = inst[B + I_POS];
    uint n_ctx = hdr[H_N_CTX];
    uint flow = FLOW_NEXT;
    if (len == 0u && pend == 0u) {
        flow = FLOW_NEXT;
    } else if (pos > n_ctx || len > n_ctx - pos || pend > n_ctx - pos - len) {
        flow = fault(F_CONTEXT_FULL, pos + pend, len);
    } else {
        inst[B + I_FEED_HAS_FIRST] = pend;
        inst[B + I_FEED_FIRST] = pend != 0u ? inst[B + I_PENDING] : 0u;
        inst[B + I_FEED_OFFSET] = offset;
        inst[B + I_FEED_LEN] = len;
        inst[B + I_FEED_CURSOR] = 0u;
        inst[B + I_HAS_PENDING] = 0u;
        inst[B + I_PENDING] = 0u;
        inst[B + I_STATUS] = ST_FEED;
        flow = FLOW_YIELD;
    }
    return flow;
}

// Takes `n` arena tokens with a compare-and-swap loop on the bump pointer: the first one's
// index, or NONE (after a fault) when they do not fit.
uint arena_alloc(uint n) {
    uint cap = hdr[H_ARENA_CAP];
    uint used = atomicAdd(hdr[H_ARENA_USED], 0u);
    uint got = NONE;
    bool done = false;
    while (!done) {
        if (used > cap || n > cap - used) {
            fault(F_ARENA_FULL, n, used);
            done = true;
        } else {
            uint seen = atomicCompSwap(hdr[H_ARENA_USED], used, used + n);
            if (seen == used) {
                got = used;
                done = true;
            }
            used = seen;
        }
    }
    return got;
}

// `gen limit, stop`: a new span of `limit` arena slots; its first token is the presample.
uint start_gen(uint limit, uint stop) {
    bool has_pre = inst[B + I_HAS_PRESAMPLE] != 0u;
    uint pre_token = inst[B + I_PRE_TOKEN];
    float pre_logprob = uintBitsToFloat(inst[B + I_PRE_LOGPROB]);
    clear_presample();
    uint flow = FLOW_FAULT;
    uint offset = NONE;
    if (!has_pre && inst[B + I_HAS_PENDING] == 0u) {
        flow = fault(F_NOTHING_TO_GENERATE, 0u, 0u);
    } else {
        offset = arena_alloc(limit);
    }
    if (offset != NONE) {
        inst[B + I_GEN_LIMIT] = limit;
        inst[B + I_GEN_STOP] = stop;
        inst[B + I_GEN_LOGPROB_SUM] = 0u;
        inst[B + I_HAS_LAST] = 1u;
        inst[B + I_LAST_OFFSET] = offset;
        inst[B + I_LAST_LEN] = 0u;
        inst[B + I_LAST_GENERATED] = 0u;
        inst[B + I_LAST_FINISH] = FIN_NONE;
        inst[B + I_LAST_STOP] = 0u;
        inst[B + I_LAST_SCORE] = 0xff800000u; // -inf
        uint pos = inst[B + I_POS];
        uint n_ctx = hdr[H_N_CTX];
        bool full = has_pre ? pos >= n_ctx : pos + inst[B + I_HAS_PENDING] >= n_ctx;
        if (limit == 0u || full) {
            inst[B + I_LAST_FINISH] = limit == 0u ? FIN_LENGTH : FIN_CONTEXT;
            flow = FLOW_NEXT;
        } else if (has_pre && vm_accept(pre_token, pre_logprob)) {
            flow = FLOW_NEXT;
        } else {
            inst[B + I_STATUS] = ST_GEN;
            flow = FLOW_YIELD;
        }
    }
    return flow;
}

// ---- mailboxes ----

// The first word of slot `slot` of mailbox `m` visible at this step, or NONE after a fault.
uint read_slot(uint m, uint slot) {
    uint h = m * BOX_WORDS;
    uint s = NONE;
    if (slot >= boxes[h + B_CAP]) {
        fault(F_SLOT_PAST_CAPACITY, slot, 0u);
    } else {
        uint at = boxes[h + B_SLOTS] + slot * SLOT_WORDS;
        uint seq = atomicAdd(boxes[at + S_SEQ], 0u);
        if (seq == 0u || !before_now(boxes[at + S_STAMP_LO], boxes[at + S_STAMP_HI])) {
            fault(F_SLOT_EMPTY, slot, 0u);
        } else {
            s = at;
        }
    }
    return s;
}

uint send(uint m, uint slot) {
    uint h = m * BOX_WORDS;
    uint flow = FLOW_NEXT;
    uint s = boxes[h + B_SLOTS] + slot * SLOT_WORDS;
    if (slot >= boxes[h + B_CAP]) {
        flow = fault(F_SLOT_PAST_CAPACITY, slot, 0u);
    } else if (atomicCompSwap(boxes[s + S_CLAIM], 0u, 1u) != 0u) {
        flow = fault(F_SLOT_FULL, slot, 0u);
    } else {
        boxes[s + S_OFFSET] = inst[B + I_LAST_OFFSET];
        boxes[s + S_LEN] = inst[B + I_LAST_LEN];
        boxes[s + S_GENERATED] = inst[B + I_LAST_GENERATED];
        boxes[s + S_FINISH] = inst[B + I_LAST_FINISH];
        boxes[s + S_STOP] = inst[B + I_LAST_STOP];
        boxes[s + S_SCORE] = inst[B + I_LAST_SCORE];
        boxes[s + S_SENDER] = inst[B + I_ID];
        boxes[s + S_PARENT] = inst[B + I_PARENT];
        boxes[s + S_STAMP_LO] = hdr[H_STEP_LO];
        boxes[s + S_STAMP_HI] = hdr[H_STEP_HI];
        memoryBarrierBuffer();
        atomicExchange(boxes[s + S_SEQ], 1u);
        atomicAdd(boxes[h + B_COUNT], 1u);
        // Every sender of this step writes the same three words.
        atomicExchange(boxes[h + B_FRESH_STEP_LO], hdr[H_STEP_LO]);
        atomicExchange(boxes[h + B_FRESH_STEP_HI], hdr[H_STEP_HI]);
        atomicExchange(boxes[h + B_FRESH_BASE], boxes[h + B_VISIBLE]);
    }
    return flow;
}

uint wait_for(uint m, uint count) {
    uint h = m * BOX_WORDS;
    uint have = boxes[h + B_VISIBLE];
    uint flow = FLOW_NEXT;
    if (count > boxes[h + B_CAP]) {
        flow = fault(F_WAIT_PAST_CAPACITY, count, 0u);
    } else if (have < count) {
        inst[B + I_WAIT_KIND] = WAIT_MAILBOX;
        inst[B + I_WAIT_INDEX] = m;
        inst[B + I_WAIT_A] = have;
        inst[B + I_WAIT_B] = count;
        flow = FLOW_BLOCK;
    }
    return flow;
}

// Last span := the message of slots lo..hi with the highest score (ties: the lowest slot).
uint best(uint m, uint lo, uint hi) {
    uint flow = FLOW_NEXT;
    uint chosen = NONE;
    if (lo >= hi) {
        flow = fault(F_EMPTY_RANGE, lo, hi);
    } else {
        chosen = read_slot(m, lo);
    }
    for (uint slot = lo + 1u; chosen != NONE && slot < hi; slot++) {
        uint s = read_slot(m, slot);
        if (s == NONE) {
            chosen = NONE;
        } else if (uintBitsToFloat(boxes[s + S_SCORE]) > uintBitsToFloat(boxes[chosen + S_SCORE])) {
            chosen = s;
        }
    }
    if (chosen == NONE) {
        flow = FLOW_FAULT;
    } else {
        inst[B + I_HAS_LAST] = 1u;
        inst[B + I_LAST_OFFSET] = boxes[chosen + S_OFFSET];
        inst[B + I_LAST_LEN] = boxes[chosen + S_LEN];
        inst[B + I_LAST_GENERATED] = boxes[chosen + S_GENERATED];
        inst[B + I_LAST_FINISH] = boxes[chosen + S_FINISH];
        inst[B + I_LAST_STOP] = boxes[chosen + S_STOP];
        inst[B + I_LAST_SCORE] = boxes[chosen + S_SCORE];
    }
    return flow;
}

// ---- queues ----

void set_task(uint index, uint item) {
    inst[B + I_TASK] = index;
    inst[B + I_PARENT] = queues[item + TASK_PARENT];
    inst[B + I_HAS_TASK_SPAN] = 1u;
    inst[B + I_TASK_OFFSET] = queues[item + TASK_OFFSET];
    inst[B + I_TASK_LEN] = queues[item + TASK_LEN];
}

// Whether queue `h`'s close is final for the pushes and takes of this step.
bool closed_before(uint h, uint by) {
    bool earlier = before_now(queues[h + Q_CLOSED_STEP_LO], queues[h + Q_CLOSED_STEP_HI]);
    return by == CLOSED_BY_HOST || (by != CLOSED_OPEN && earlier);
}

uint take(uint q, uint closed_target) {
    uint h = q * QUEUE_WORDS;
    uint visible = queues[h + Q_VISIBLE];
    uint t = atomic_load(h + Q_TAKEN);
    bool got = false;
    while (!got && t < visible) {
        uint seen = atomicCompSwap(queues[h + Q_TAKEN], t, t + 1u);
        got = seen == t;
        if (!got) {
            t = seen;
        }
    }
    uint flow = FLOW_NEXT;
    if (got) {
        set_task(t, queues[h + Q_ITEMS] + t * TASK_WORDS);
    } else if (closed_before(h, atomic_load(h + Q_CLOSED_BY))) {
        g_target = closed_target;
        flow = FLOW_JUMP;
    } else {
        inst[B + I_WAIT_KIND] = WAIT_QUEUE;
        inst[B + I_WAIT_INDEX] = q;
        inst[B + I_WAIT_A] = visible;
        inst[B + I_WAIT_B] = t;
        flow = FLOW_BLOCK;
    }
    return flow;
}

// Appends the last span as a task into register word `rd`.
uint push(uint q, uint rd) {
    uint h = q * QUEUE_WORDS;
    uint by = atomic_load(h + Q_CLOSED_BY);
    uint flow = FLOW_NEXT;
    // A close is final once visible; within its step only its own instance has seen it.
    if (by != CLOSED_OPEN && (by == inst[B + I_ID] || closed_before(h, by))) {
        flow = fault(F_QUEUE_CLOSED, 0u, 0u);
    } else {
        uint cap = queues[h + Q_CAP];
        uint len = atomic_load(h + Q_LEN);
        bool done = false;
        while (!done) {
            if (len >= cap) {
                flow = fault(F_QUEUE_FULL, 0u, 0u);
                done = true;
            } else {
                uint seen = atomicCompSwap(queues[h + Q_LEN], len, len + 1u);
                done = seen == len;
                if (!done) {
                    len = seen;
                }
            }
        }
        if (flow == FLOW_NEXT) {
            uint item = queues[h + Q_ITEMS] + len * TASK_WORDS;
            queues[item + TASK_PARENT] = inst[B + I_PARENT];
            queues[item + TASK_OFFSET] = inst[B + I_LAST_OFFSET];
            queues[item + TASK_LEN] = inst[B + I_LAST_LEN];
            atomicExchange(queues[h + Q_FRESH_STEP_LO], hdr[H_STEP_LO]);
            atomicExchange(queues[h + Q_FRESH_STEP_HI], hdr[H_STEP_HI]);
            atomicExchange(queues[h + Q_FRESH_BASE], queues[h + Q_VISIBLE]);
            inst[B + rd] = len;
        }
    }
    return flow;
}

// The first close of a step wins for the lowest instance (the host's first in instance
// order); a queue closed before this step, or by the host, stays as it is.
void close_queue(uint q) {
    uint h = q * QUEUE_WORDS;
    if (!closed_before(h, atomic_load(h + Q_CLOSED_BY))) {
        atomicMin(queues[h + Q_CLOSED_BY], inst[B + I_ID]);
        atomicExchange(queues[h + Q_CLOSED_STEP_LO], hdr[H_STEP_LO]);
        atomicExchange(queues[h + Q_CLOSED_STEP_HI], hdr[H_STEP_HI]);
    }
}

void emit(uint round) {
    uint e = event_record();
    if (e != NONE) {
        events[e + E_KIND] = EV_OUTPUT;
        events[e + E_INSTANCE] = inst[B + I_ID];
        events[e + E_PARENT] = inst[B + I_PARENT];
        events[e + E_ROUND] = round;
        events[e + E_OFFSET] = inst[B + I_LAST_OFFSET];
        events[e + E_LEN] = inst[B + I_LAST_LEN];
        events[e + E_FINISH] = inst[B + I_LAST_FINISH];
        events[e + E_STOP] = inst[B + I_LAST_STOP];
        events[e + E_SCORE] = inst[B + I_LAST_SCORE];
    }
}

// ---- one instruction ----

uint exec(uint p) {
    uint w0 = prog[p * INSTR_WORDS];
    uint op = w0 & 0xffu;
    uint ka = (w0 >> 8u) & 3u;
    uint kb = (w0 >> 10u) & 3u;
    uint kc = (w0 >> 12u) & 3u;
    uint a = prog[p * INSTR_WORDS + 1u];
    uint b = prog[p * INSTR_WORDS + 2u];
    uint c = prog[p * INSTR_WORDS + 3u];
    uint ia = imm(ka, a);
    bool has_last = inst[B + I_HAS_LAST] != 0u;
    uint flow = FLOW_NEXT;
    // Name operands past their tables: a program the assembler never makes.
    bool uses_box = op == OP_APPEND_MSG || op == OP_SEND || op == OP_WAIT || op == OP_BEST;
    bool uses_queue = op == OP_TAKE || op == OP_PUSH || op == OP_CLOSE;
    bool needs_last = op == OP_APPEND_LAST || op == OP_SEND || op == OP_PUSH || op == OP_EMIT;
    if (needs_last && !has_last) {
        flow = fault(F_NO_SPAN, 0u, 0u);
    } else if ((uses_box && ia >= hdr[H_N_BOXES]) || (uses_queue && ia >= hdr[H_N_QUEUES])
               || (op == OP_APPEND_CONST && ia >= hdr[H_N_CONSTS]) || op > OP_SEED) {
        flow = fault(F_BAD_OPERAND, ia, 0u);
    } else if (op == OP_HALT) {
        flow = FLOW_HALT;
    } else if (op == OP_SET) {
        inst[B + dest(ka, a)] = val(kb, b);
    } else if (op >= OP_ADD && op <= OP_REM) {
        uint x = val(kb, b);
        uint y = val(kc, c);
        if ((op == OP_DIV || op == OP_REM) && y == 0u) {
            flow = fault(F_DIV_BY_ZERO, 0u, 0u);
        } else {
            inst[B + dest(ka, a)] = op == OP_ADD ? x + y
                : op == OP_SUB ? x - y
                : op == OP_MUL ? x * y
                : op == OP_DIV ? x / y
                : x % y;
        }
    } else if (op == OP_JMP) {
        g_target = ia;
        flow = FLOW_JUMP;
    } else if (op >= OP_BEQ && op <= OP_BGE) {
        uint x = val(ka, a);
        uint y = val(kb, b);
        if (op == OP_BEQ ? x == y : op == OP_BNE ? x != y : op == OP_BLT ? x < y : x >= y) {
            g_target = imm(kc, c);
            flow = FLOW_JUMP;
        }
    } else if (op == OP_APPEND_TASK) {
        if (inst[B + I_HAS_TASK_SPAN] == 0u) {
            flow = fault(F_NO_TASK, 0u, 0u);
        } else {
            flow = start_append(inst[B + I_TASK_OFFSET], inst[B + I_TASK_LEN]);
        }
    } else if (op == OP_APPEND_CONST) {
        flow = start_append(tables[ia * CONST_WORDS], tables[ia * CONST_WORDS + 1u]);
    } else if (op == OP_APPEND_LAST) {
        flow = start_append(inst[B + I_LAST_OFFSET], inst[B + I_LAST_LEN]);
    } else if (op == OP_APPEND_MSG) {
        uint s = read_slot(ia, val(kb, b));
        flow = s == NONE ? FLOW_FAULT : start_append(boxes[s + S_OFFSET], boxes[s + S_LEN]);
    } else if (op == OP_GEN) {
        flow = start_gen(val(ka, a), imm(kb, b));
    } else if (op == OP_SEND) {
        flow = send(ia, val(kb, b));
    } else if (op == OP_WAIT) {
        flow = wait_for(ia, val(kb, b));
    } else if (op == OP_BEST) {
        flow = best(ia, val(kb, b), val(kc, c));
    } else if (op == OP_TAKE) {
        flow = take(ia, imm(kb, b));
    } else if (op == OP_TASK) {
        uint x = val(ka, a);
        if (hdr[H_N_QUEUES] == 0u || x >= queues[Q_LEN]) {
            flow = fault(F_TASK_PAST_END, x, 0u);
        } else {
            set_task(x, queues[Q_ITEMS] + x * TASK_WORDS);
        }
    } else if (op == OP_PUSH) {
        flow = push(ia, dest(kb, b));
    } else if (op == OP_CLOSE) {
        close_queue(ia);
    } else if (op == OP_EMIT) {
        emit(val(ka, a));
    } else if (op == OP_RESET) {
        inst[B + I_POS] = 0u;
        inst[B + I_HAS_PENDING] = 0u;
        inst[B + I_PENDING] = 0u;
        clear_presample();
    } else if (op == OP_SEED) {
        uint carry;
        inst[B + I_SEED_LO] = uaddCarry(hdr[H_SEED_LO], val(ka, a), carry);
        inst[B + I_SEED_HI] = hdr[H_SEED_HI] + carry;
        inst[B + I_DRAWS_LO] = 0u;
        inst[B + I_DRAWS_HI] = 0u;
    }
    return flow;
}

// Pass 0: what each queue and mailbox holds as the step begins (writes of an earlier step
// are visible; none of this step's has happened yet).
void snapshot(uint j) {
    if (j == 0u) {
        hdr[H_CHANGED] = 0u;
    }
    if (j < hdr[H_N_QUEUES]) {
        uint h = j * QUEUE_WORDS;
        bool fresh = queues[h + Q_FRESH_STEP_LO] == hdr[H_STEP_LO]
            && queues[h + Q_FRESH_STEP_HI] == hdr[H_STEP_HI];
        queues[h + Q_VISIBLE] = fresh ? queues[h + Q_FRESH_BASE] : queues[h + Q_LEN];
    }
    if (j < hdr[H_N_BOXES]) {
        uint h = j * BOX_WORDS;
        bool fresh = boxes[h + B_FRESH_STEP_LO] == hdr[H_STEP_LO]
            && boxes[h + B_FRESH_STEP_HI] == hdr[H_STEP_HI];
        boxes[h + B_VISIBLE] = fresh ? boxes[h + B_FRESH_BASE] : boxes[h + B_COUNT];
    }
}

// Pass 1: instance `i` runs until it yields (an invocation past the instances, or of an
// instance that does not run, leaves the loop at once).
void interpret(uint i) {
    bool live = i < hdr[H_N];
    B = live ? i * INST_WORDS : 0u;
    uint status = live ? inst[B + I_STATUS] : ST_HALTED;
    bool runs = status == ST_RUN || status == ST_WAIT;
    if (runs) {
        inst[B + I_STATUS] = ST_RUN;
    }
    bool changed = false;
    bool stopped = !runs;
    uint n = 0u;
    while (!stopped && n < BUDGET) {
        n += 1u;
        uint p = inst[B + I_PC];
        uint flow = FLOW_FAULT;
        if (p >= hdr[H_N_INSTRS]) {
            fault(F_PAST_END, 0u, 0u);
        } else {
            if ((prog[p * INSTR_WORDS] & 0xffu) != OP_GEN) {
                // Only a `gen` that comes right after the append may take its presample.
                clear_presample();
            }
            flow = exec(p);
        }
        stopped = flow >= FLOW_YIELD;
        changed = changed || flow != FLOW_BLOCK;
        if (flow == FLOW_NEXT || flow == FLOW_YIELD) {
            inst[B + I_PC] = p + 1u;
        } else if (flow == FLOW_JUMP) {
            inst[B + I_PC] = g_target;
        } else if (flow == FLOW_BLOCK) {
            inst[B + I_STATUS] = ST_WAIT;
        } else if (flow == FLOW_HALT) {
            inst[B + I_STATUS] = ST_HALTED;
        } else {
            fail(g_fault, g_arg0, g_arg1);
        }
    }
    if (!stopped) {
        fail(F_NO_PROGRESS, 0u, 0u);
        changed = true;
    }
    if (changed) {
        atomicOr(hdr[H_CHANGED], 1u);
    }
}

void main() {
    uint i = global_index();
    if (pc.pass == 0u) {
        snapshot(i);
    } else {
        interpret(i);
    }
}

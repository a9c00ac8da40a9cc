; swarm: instance 0 coordinates, the others work.
;
; For each host task the coordinator asks for sub-questions, one per line, and pushes each
; non-empty line to queue `sub` (at most %n-1 per task), stopping at a line that ends other than
; with a newline (end of generation, END_ACTION, the token limit). Workers take sub-questions,
; answer them (emitted as round 1) and send the answer to slot %task (the sub-question's index
; in `sub`) of `res`. The coordinator waits for every answer so far (count = sub-questions
; pushed so far: earlier tasks' answers are all in), appends this task's in order, and emits
; its final answer (round 0). After the last task it closes `sub`; workers then halt.
; Alone (%n = 1) the coordinator answers each task directly.
;
; Deadlock-free: workers wait only for `sub` (closed at the end), the coordinator only for
; answers to sub-questions it pushed, which a worker (there is one when %n > 1) will take.

.stop LINE "END_ACTION", "\n", "\n\n"
.stop END "END_ACTION"
.const PLAN "\n\nBreak this task into a few short sub-questions, one per line:\n"
.const ASK "Answer this question briefly:\n"
.const GOT "\n\nAn answer to one of the sub-questions: "
.const FINAL "\n\nNow give the final answer to the task."
.queue sub %tasks*%n
.mailbox res %tasks*%n

    bne %id, 0, worker
    sub r4, %n, 1           ; r4: most sub-questions per task (one per worker)
                            ; r7: sub-questions pushed so far, all tasks
coordinator:
    take tasks, finish
    seed %task
    reset
    beq r4, 0, alone
    set r3, 0               ; r3: sub-questions of this task
    append.task
    append.const PLAN
line:
    gen %max, LINE
    beq %len, 0, line_end   ; an empty line asks nothing
    push sub, r5
    add r3, r3, 1
line_end:
    bge r3, r4, collect
    blt %stop, 3, collect   ; not a newline: end of generation, END_ACTION or a limit
    jmp line
collect:
    add r7, r7, r3
    wait res, r7
    sub r6, r7, r3          ; r6: this task's first sub-question
gather:
    bge r6, r7, final
    append.const GOT
    append.msg res, r6
    add r6, r6, 1
    jmp gather
final:
    append.const FINAL
    gen %max, END
    emit 0
    jmp coordinator
alone:                      ; %n = 1: answer the task directly
    append.task
    gen %max, END
    emit 0
    jmp coordinator
finish:
    close sub
    halt

worker:
    take sub, done
    add r1, %task, %tasks   ; seeds apart from the host tasks'
    seed r1
    reset
    append.const ASK
    append.task
    gen %max, END
    emit 1
    send res, %task
    jmp worker
done:
    halt

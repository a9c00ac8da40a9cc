; debate: for each host task, every instance answers, then for %rounds-1 more rounds reads the
; others' answers and revises its own. Each round's answer is emitted with the round number.
;
; Slot ((task*%rounds)+round)*%n + %id of `said` holds an instance's answer of a round. Every
; instance waits for the whole round (a count of ((task*%rounds)+round+1)*%n) before its next
; send, the last round of a task included, so rounds fill the box in order and the count is
; exact. Deadlock-free: a round only waits for the sends of that round.

.stop END "END_ACTION"
.const OTHER "\n\nAnother agent answered: "
.const REVISE "\n\nUsing the other answers as additional information, give your updated answer."
.mailbox said %tasks*%rounds*%n

    set r0, 0               ; r0: the host task
task_loop:
    bge r0, %tasks, done
    task r0
    mul r1, r0, %n
    add r1, r1, %id
    seed r1                 ; a debater per task and instance
    reset
    set r1, 0               ; r1: the round
    append.task
    gen %max, END           ; right after the append: it takes the presample
round:
    emit r1
    mul r2, r0, %rounds
    add r2, r2, r1
    mul r2, r2, %n          ; r2: the round's first slot
    add r3, r2, %id
    send said, r3
    add r4, r2, %n
    wait said, r4           ; the whole round
    add r1, r1, 1
    bge r1, %rounds, next_task
    set r5, 0               ; r5: another instance
others:
    beq r5, %id, skip
    append.const OTHER
    add r6, r2, r5
    append.msg said, r6
skip:
    add r5, r5, 1
    blt r5, %n, others
    append.const REVISE
    gen %max, END
    jmp round
next_task:
    add r0, r0, 1
    jmp task_loop
done:
    halt

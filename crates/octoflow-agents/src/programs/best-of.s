; best-of: every instance answers every host task; instance 0 emits the answer with the best
; score (mean log-probability; ties: the lowest instance).
;
; Slot task*%n + %id of `answers` holds instance %id's answer to a task. An instance holds
; its send until every earlier task is fully answered (`wait answers, task*%n`): then no
; answer to task t+1 exists before all of task t's, so "the box holds (t+1)*%n messages" means
; "task t is complete" and instance 0's wait is exact. Others go on generating the next task
; meanwhile. Deadlock-free: the wait for task t only needs the sends of task t-1, which need
; only those of t-2, and so on.

.stop END "END_ACTION"
.mailbox answers %tasks*%n

    set r0, 0               ; r0: the host task
next:
    bge r0, %tasks, done
    task r0
    mul r2, r0, %n          ; r2: the task's first slot
    add r1, r2, %id         ; r1: this instance's slot (and seed: a candidate per task)
    seed r1
    reset
    append.task
    gen %max, END
    wait answers, r2        ; every earlier task answered
    send answers, r1
    add r0, r0, 1
    bne %id, 0, next
    add r3, r2, %n          ; instance 0: wait for the task's %n answers, keep the best
    wait answers, r3
    best answers, r2, r3
    emit 0
    jmp next
done:
    halt

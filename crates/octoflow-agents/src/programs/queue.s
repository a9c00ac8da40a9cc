; queue: every instance drains the host's tasks, one answer per task.
;
; A task's transcript depends only on the task (seeded by its index), never on the instance
; that took it. Deadlock-free: `tasks` is closed from the start, so `take` never waits.

.stop END "END_ACTION"

next:
    take tasks, done        ; the next host task, or done when none is left
    seed %task
    reset
    append.task
    gen %max, END           ; the presample of the append is the first token
    emit 0
    jmp next
done:
    halt

use super::*;

fn span(offset: u32, score: f32) -> Span {
    Span {
        offset,
        len: 1,
        generated: 1,
        finish: None,
        stop: 0,
        score,
    }
}

fn msg(sender: u32) -> Message {
    Message {
        span: span(sender, 0.0),
        sender,
        parent: 0,
    }
}

fn task(offset: u32) -> Task {
    Task {
        offset,
        len: 1,
        parent: 0,
    }
}

#[test]
fn the_arena_hands_out_disjoint_ranges_until_full() {
    let mut a = Arena::new(10);
    assert_eq!(a.put(&[7, 8, 9]), Ok(0));
    assert_eq!(a.alloc(4), Ok(3));
    assert_eq!(a.alloc(0), Ok(7));
    assert_eq!(a.get(0, 3), &[7, 8, 9]);
    assert_eq!(
        a.alloc(4),
        Err(Fault::ArenaFull {
            need: 4,
            used: 7,
            cap: 10
        })
    );
    assert_eq!(a.alloc(3), Ok(7));
    assert_eq!(a.used(), 10);
}

#[test]
fn a_message_is_seen_from_the_step_after_its_send() {
    let mut m = Mailbox::new("box", 4);
    m.send(2, msg(5), 7).expect("empty slot");
    assert_eq!(m.count(7), 0);
    assert_eq!(
        m.read(2, 7),
        Err(Fault::SlotEmpty {
            mailbox: "box".into(),
            slot: 2
        })
    );
    assert_eq!(m.count(8), 1);
    assert_eq!(m.read(2, 8).map(|m| m.sender), Ok(5));
    // A second send in a later step: the first stays visible, the second is not yet.
    m.send(0, msg(6), 9).expect("empty slot");
    assert_eq!(m.count(9), 1);
    assert_eq!(m.count(10), 2);
    assert_eq!(m.written(), 2);
}

#[test]
fn a_slot_is_written_once_and_only_within_the_capacity() {
    let mut m = Mailbox::new("box", 4);
    m.send(1, msg(0), 0).expect("empty slot");
    assert_eq!(
        m.send(1, msg(1), 0),
        Err(Fault::SlotFull {
            mailbox: "box".into(),
            slot: 1
        })
    );
    assert_eq!(
        m.send(1, msg(1), 5),
        Err(Fault::SlotFull {
            mailbox: "box".into(),
            slot: 1
        })
    );
    let past = Fault::SlotPastCapacity {
        mailbox: "box".into(),
        slot: 4,
        cap: 4,
    };
    assert_eq!(m.send(4, msg(1), 0), Err(past.clone()));
    assert_eq!(m.read(4, 9), Err(past));
}

#[test]
fn a_pushed_task_is_taken_from_the_next_step_in_order() {
    let mut q = Queue::new("q", 3);
    assert_eq!(q.take(0), Take::Empty);
    assert_eq!(q.push(task(10), 0, 0), Ok(0));
    assert_eq!(q.push(task(11), 0, 1), Ok(1));
    assert_eq!(q.take(0), Take::Empty);
    assert_eq!(q.take(1), Take::Task(0, task(10)));
    assert_eq!(q.take(1), Take::Task(1, task(11)));
    assert_eq!(q.take(1), Take::Empty);
    assert_eq!(q.push(task(12), 1, 0), Ok(2));
    assert_eq!(
        q.push(task(13), 1, 0),
        Err(Fault::QueueFull {
            queue: "q".into(),
            cap: 3
        })
    );
    assert_eq!(q.take(2), Take::Task(2, task(12)));
}

#[test]
fn a_close_ends_takes_from_the_next_step_and_refuses_later_pushes() {
    let mut q = Queue::new("q", 8);
    q.push(task(1), 3, 0).expect("room");
    q.close(3, 0);
    // Another instance's push in the step of the close still lands (instance order must not
    // matter); the closer's own does not.
    assert_eq!(q.push(task(2), 3, 1), Ok(1));
    let closed = Err(Fault::QueueClosed { queue: "q".into() });
    assert_eq!(q.push(task(3), 3, 0), closed.clone());
    assert_eq!(
        q.take(3),
        Take::Empty,
        "nothing visible yet, close not seen"
    );
    assert_eq!(q.take(4), Take::Task(0, task(1)));
    assert_eq!(q.take(4), Take::Task(1, task(2)));
    assert_eq!(q.take(4), Take::Closed);
    assert_eq!(q.push(task(4), 4, 1), closed);
}

#[test]
fn the_host_queue_is_closed_and_visible_from_the_start() {
    let mut q = Queue::host(vec![task(0), task(5)]);
    assert_eq!(q.take(0), Take::Task(0, task(0)));
    assert_eq!(q.get(1), Some(task(5)));
    assert_eq!(q.take(0), Take::Task(1, task(5)));
    assert_eq!(q.take(0), Take::Closed);
    assert_eq!(
        q.push(task(9), 0, 0),
        Err(Fault::QueueClosed {
            queue: "tasks".into()
        })
    );
}

use super::*;
use crate::pattern::Pattern;
use crate::program::CapacityEnv;

/// One id per character (its code point), so tests can predict constants.
fn chars(s: &str) -> Vec<u32> {
    s.chars().map(|c| c as u32).collect()
}

fn asm(src: &str) -> Result<Program, AsmError> {
    assemble(src, &chars)
}

/// The error `src` gives, as `(line, message)`.
fn err(src: &str) -> (usize, String) {
    match asm(src) {
        Ok(_) => panic!("assembled, expected an error:\n{src}"),
        Err(e) => (e.line, e.kind.to_string()),
    }
}

#[test]
fn every_error_class_names_its_line_and_reason() {
    let cases: &[(&str, usize, &str)] = &[
        ("halt\n  foo r1\nhalt", 2, "unknown instruction `foo`"),
        (
            ".bogus X 1\nhalt",
            1,
            "unknown directive `.bogus` (expected .const, .stop, .queue or .mailbox)",
        ),
        ("set r1\nhalt", 1, "`set` takes 2 operand(s), found 1"),
        ("halt r1", 1, "`halt` takes 0 operand(s), found 1"),
        (
            "add r1, , r2\nhalt",
            1,
            "`add`: an operand is missing between commas",
        ),
        (
            "set 5, r1\nhalt",
            1,
            "operand 1 of `set`: expected a register, found `5`",
        ),
        (
            "l: jmp r1",
            1,
            "operand 1 of `jmp`: expected a label, found `r1`",
        ),
        (
            ".queue q 4\nsend q, 0\nhalt",
            2,
            "operand 1 of `send`: expected a mailbox, found `q` (a queue)",
        ),
        (
            "l: set r1, l\nhalt",
            1,
            "operand 2 of `set`: expected a value (number, register or special), found `l` (a label)",
        ),
        (
            "gen 4, %max\nhalt",
            1,
            "operand 2 of `gen`: expected a stop set (or -), found `%max`",
        ),
        (
            "set r1, -\nhalt",
            1,
            "operand 2 of `set`: expected a value (number, register or special), found `-`",
        ),
        (
            "set r16, 1\nhalt",
            1,
            "register `r16` does not exist (registers are r0..r15)",
        ),
        (
            "\n\nset r1, %foo\nhalt",
            3,
            "unknown special `%foo` (known: %id %n %task %parent %tasks %max %rounds %len %finish %pos %stop)",
        ),
        ("jmp nowhere", 1, "`nowhere` is not defined"),
        (
            "a: halt\n\na: halt",
            3,
            "`a` is already defined on line 1",
        ),
        (
            ".const x \"a\"\nx: halt",
            2,
            "`x` is already defined on line 1",
        ),
        (
            ".queue tasks 4\nhalt",
            1,
            "`tasks` is the built-in queue of host tasks",
        ),
        (
            ".const r3 \"x\"\nhalt",
            1,
            "`r3` cannot be a name: it reads as a register, a number or a special",
        ),
        (
            ".const 3x \"a\"\nhalt",
            1,
            "`3x` is not a valid name (letters, digits, `_`, `.`; not starting with a digit)",
        ),
        (
            "set r1, 4294967296\nhalt",
            1,
            "`4294967296` is not a number (decimal or 0x hex, at most 4294967295)",
        ),
        (
            "set r1, 0xZZ\nhalt",
            1,
            "`0xZZ` is not a number (decimal or 0x hex, at most 4294967295)",
        ),
        (".const c \"abc\nhalt", 1, "unterminated string"),
        (
            ".const c \"a\\qb\"\nhalt",
            1,
            "unknown escape `\\q` (known: \\n \\t \\r \\0 \\\\ \\\")",
        ),
        (".const c abc\nhalt", 1, "expected a string in double quotes, found `abc`"),
        (".const c \"\"\nhalt", 1, "constant `c` tokenizes to no tokens"),
        (
            ".stop s \"a\", \"\"\nhalt",
            1,
            "stop set `s`: entry 1 tokenizes to no tokens (it would match anywhere)",
        ),
        (
            ".stop s \"a\" \"b\"\nhalt",
            1,
            "expected `,` between stop entries, found `\"b\"`",
        ),
        (
            ".queue q %foo\nhalt",
            1,
            "capacity `%foo`: expected positive integers and %n, %tasks, %rounds joined by `*`",
        ),
        (
            ".mailbox m 0\nhalt",
            1,
            "capacity `0`: expected positive integers and %n, %tasks, %rounds joined by `*`",
        ),
        (
            ".mailbox m 2*\nhalt",
            1,
            "capacity `2*`: expected positive integers and %n, %tasks, %rounds joined by `*`",
        ),
        (".mailbox m\nhalt", 1, ".mailbox m needs a value"),
        (
            ".mailbox m 2*2\nsend m, 4\nhalt",
            2,
            "slot 4 is past mailbox `m`'s capacity of 4",
        ),
        (
            ".mailbox m 4\nappend.msg m, 9\nhalt",
            2,
            "slot 9 is past mailbox `m`'s capacity of 4",
        ),
        (
            ".mailbox m 4\nbest m, 0, 5\nhalt",
            2,
            "slot 4 is past mailbox `m`'s capacity of 4",
        ),
        (
            ".mailbox m 4\nwait m, 5\nhalt",
            2,
            "waits for 5 messages but mailbox `m` holds at most 4",
        ),
        (
            ".mailbox m %n\nbest m, 2, 2\nhalt",
            2,
            "`best` over the empty slot range 2..2",
        ),
        (
            "halt\nend:",
            2,
            "label `end` marks no instruction (nothing follows it)",
        ),
        (
            "halt\nset r1, 1 ; no end",
            2,
            "the last instruction (`set`) can fall through the end of the program; end with `halt` or `jmp`",
        ),
        (
            "l: take tasks, l",
            1,
            "the last instruction (`take`) can fall through the end of the program; end with `halt` or `jmp`",
        ),
        ("; nothing\n\n", 2, "the program has no instructions"),
    ];
    let wrong: Vec<String> = cases
        .iter()
        .filter(|&&(src, line, message)| err(src) != (line, message.to_string()))
        .map(|&(src, line, message)| {
            format!("{src:?}: want ({line}, {message}), got {:?}", err(src))
        })
        .collect();
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn a_program_past_4096_instructions_is_refused_at_the_first_one_too_many() {
    let src = "halt\n".repeat(4097);
    assert_eq!(
        err(&src),
        (
            4097,
            "the program has 4097 instructions, at most 4096 are allowed".into()
        )
    );
    assert!(asm(&"halt\n".repeat(4096)).is_ok());
}

#[test]
fn the_error_display_leads_with_the_line() {
    let e = asm("halt\nfrob").unwrap_err();
    assert_eq!(e.to_string(), "line 2: unknown instruction `frob`");
}

#[test]
fn names_may_be_used_before_they_are_declared() {
    let p =
        asm("start: append.const hi\n  gen 4, s\n  jmp start\n.const hi \"hi\"\n.stop s \"x\", 7")
            .expect("assembles");
    assert_eq!(p.instructions().len(), 3);
    assert_eq!(p.consts()[0].value, chars("hi"));
    assert_eq!(p.stops()[0].value, vec![chars("x"), vec![7]]);
    assert_eq!(p.instructions()[1].b, Operand::Imm(0));
    assert_eq!(p.instructions()[2].a, Operand::Imm(0));
}

#[test]
fn comments_strings_labels_and_operands_parse_as_written() {
    let src = r#"
# a comment
.const c "a;b#c\n\"q\"\t\\"   ; the ; and # inside the string are text
.stop s "END", 0x10
.queue q %tasks * %rounds*%n
.mailbox m 3
a: b: set r15, 0x1f      ; two labels on one instruction
    gen %max, -
    push q, r2
    beq r15, %stop, a
    send m, 2
    jmp b
"#;
    let p = asm(src).expect("assembles");
    assert_eq!(p.consts()[0].value, chars("a;b#c\n\"q\"\t\\"));
    assert_eq!(p.stops()[0].value, vec![chars("END"), vec![16]]);
    let cap = &p.queues()[1].value;
    assert_eq!(cap.to_string(), "%tasks*%rounds*%n");
    let env = CapacityEnv {
        n: 3,
        tasks: 5,
        rounds: 2,
    };
    assert_eq!(cap.eval(env), 30);
    assert_eq!(p.queues()[0].name, "tasks");
    let i = p.instructions();
    assert_eq!(
        i[0],
        Instr::new(Op::Set, &[Operand::Reg(15), Operand::Imm(31)])
    );
    assert_eq!(
        i[1],
        Instr::new(
            Op::Gen,
            &[Operand::Special(Special::Max), Operand::Imm(NO_STOP)]
        )
    );
    assert_eq!(
        i[2],
        Instr::new(Op::Push, &[Operand::Imm(1), Operand::Reg(2)])
    );
    assert_eq!(
        i[3],
        Instr::new(
            Op::Beq,
            &[
                Operand::Reg(15),
                Operand::Special(Special::Stop),
                Operand::Imm(0)
            ]
        )
    );
    assert_eq!(i[5], Instr::new(Op::Jmp, &[Operand::Imm(0)]));
    assert_eq!(p.source_line(0).map(|l| l.line), Some(7));
    assert_eq!(
        p.source_line(0).map(|l| l.text.as_str()),
        Some("set r15, 0x1f")
    );
    assert_eq!(p.locate(4), "pc 4 (line 11: `send m, 2`)");
}

#[test]
fn the_words_decode_back_to_the_program() {
    for pattern in Pattern::ALL {
        let p = asm(pattern.source()).expect("assembles");
        let words = p.words();
        assert_eq!(words.len(), 4 * p.instructions().len());
        assert_eq!(
            crate::isa::decode_words(&words).as_deref(),
            Ok(p.instructions())
        );
    }
}

#[test]
fn the_shipped_programs_assemble() {
    for pattern in Pattern::ALL {
        let p = asm(pattern.source()).unwrap_or_else(|e| panic!("{pattern}: {e}"));
        assert!(p.instructions().len() > 5, "{pattern}");
        assert_eq!(pattern.name().parse::<Pattern>(), Ok(pattern));
    }
    let e = "round-robin".parse::<Pattern>().unwrap_err();
    assert_eq!(
        e.to_string(),
        "unknown pattern `round-robin` (expected queue, best-of, debate or swarm)"
    );
}

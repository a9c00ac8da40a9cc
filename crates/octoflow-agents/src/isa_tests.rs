use super::*;

/// Every operand a role allows, the specials all of them.
fn samples(role: Role) -> Vec<Operand> {
    match role {
        Role::Value => {
            let mut v = vec![Operand::Imm(0), Operand::Imm(u32::MAX), Operand::Reg(15)];
            v.extend(Special::ALL.iter().map(|&s| Operand::Special(s)));
            v
        }
        Role::Dest => vec![Operand::Reg(0), Operand::Reg(7), Operand::Reg(15)],
        Role::Stop => vec![Operand::Imm(3), Operand::Imm(NO_STOP)],
        _ => vec![Operand::Imm(0), Operand::Imm(4095)],
    }
}

#[test]
fn every_opcode_and_operand_kind_round_trips_through_the_words() {
    let mut checked = 0;
    for &op in Op::ALL {
        let roles = op.roles();
        assert!(roles.len() <= 3, "{op:?}");
        // Each role in turn takes each of its samples; the others their first.
        for (i, &role) in roles.iter().enumerate() {
            for sample in samples(role) {
                let mut operands: Vec<Operand> = roles.iter().map(|&r| samples(r)[0]).collect();
                operands[i] = sample;
                let instr = Instr::new(op, &operands);
                let words = instr.encode();
                assert_eq!(Instr::decode(words), Ok(instr), "{op:?} {operands:?}");
                checked += 1;
            }
        }
        if roles.is_empty() {
            let instr = Instr::new(op, &[]);
            assert_eq!(Instr::decode(instr.encode()), Ok(instr));
            checked += 1;
        }
    }
    assert!(checked > 100, "only {checked} round trips");
}

#[test]
fn the_encoding_is_the_documented_layout() {
    // set r3, %pos
    let i = Instr::new(Op::Set, &[Operand::Reg(3), Operand::Special(Special::Pos)]);
    assert_eq!(i.encode(), [1 | 1 << 8 | 2 << 10, 3, 9, 0]);
    // beq r1, 7, <label at 12>
    let i = Instr::new(
        Op::Beq,
        &[Operand::Reg(1), Operand::Imm(7), Operand::Imm(12)],
    );
    assert_eq!(i.encode(), [8 | 1 << 8, 1, 7, 12]);
    // gen %max, -
    let i = Instr::new(
        Op::Gen,
        &[Operand::Special(Special::Max), Operand::Imm(NO_STOP)],
    );
    assert_eq!(i.encode(), [16 | 2 << 8, 5, u32::MAX, 0]);
}

#[test]
fn opcodes_and_specials_are_found_by_their_names_and_codes() {
    for (code, &op) in Op::ALL.iter().enumerate() {
        assert_eq!(op as usize, code, "opcodes are numbered densely in order");
        assert_eq!(Op::from_code(code as u8), Some(op));
        assert_eq!(Op::from_mnemonic(op.mnemonic()), Some(op));
    }
    for (code, &s) in Special::ALL.iter().enumerate() {
        assert_eq!(s as usize, code);
        assert_eq!(Special::from_code(code as u32), Some(s));
        assert_eq!(Special::from_name(s.name()), Some(s));
    }
    assert_eq!(Op::from_code(Op::ALL.len() as u8), None);
    assert_eq!(Special::from_code(Special::ALL.len() as u32), None);
}

#[test]
fn bad_words_are_refused_with_a_reason() {
    let cases: &[([u32; 4], DecodeError)] = &[
        ([200, 0, 0, 0], DecodeError::UnknownOp(200)),
        ([1 << 14, 0, 0, 0], DecodeError::StrayBits(1 << 14)),
        (
            [1 | 3 << 8, 0, 0, 0],
            DecodeError::BadKind {
                operand: 0,
                kind: 3,
            },
        ),
        (
            [1 | 1 << 8, 16, 0, 0],
            DecodeError::BadRegister {
                operand: 0,
                word: 16,
            },
        ),
        (
            [1 | 1 << 8 | 2 << 10, 0, 99, 0],
            DecodeError::BadSpecial {
                operand: 1,
                word: 99,
            },
        ),
        // set's destination must be a register.
        (
            [1, 0, 0, 0],
            DecodeError::WrongKind {
                op: "set",
                operand: 0,
                expected: "a register",
            },
        ),
        // jmp's label must be an immediate.
        (
            [7 | 1 << 8, 2, 0, 0],
            DecodeError::WrongKind {
                op: "jmp",
                operand: 0,
                expected: "a label",
            },
        ),
        (
            [0, 0, 0, 5],
            DecodeError::UnusedOperand {
                op: "halt",
                operand: 2,
            },
        ),
    ];
    for (words, want) in cases {
        assert_eq!(Instr::decode(*words).as_ref(), Err(want), "{words:?}");
    }
    assert_eq!(
        DecodeError::UnusedOperand {
            op: "halt",
            operand: 2
        }
        .to_string(),
        "`halt` does not use operand 2, which must be immediate 0"
    );
}

#[test]
fn a_word_array_decodes_by_instruction_and_names_the_bad_one() {
    let good = Instr::new(Op::Halt, &[]).encode();
    assert_eq!(decode_words(&good[..3]), Err(DecodeError::Length(3)));
    let mut words = good.to_vec();
    words.extend_from_slice(&[200, 0, 0, 0]);
    let err = decode_words(&words).unwrap_err();
    assert_eq!(err.to_string(), "instruction 1: unknown opcode 200");
    assert_eq!(decode_words(&good), Ok(vec![Instr::new(Op::Halt, &[])]));
}

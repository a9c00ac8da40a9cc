use crate::test_shaders::CONTROL_ADD;
use crate::testing::{assert_no_validation_errors, gpu_or_skip};
use crate::{Pipeline, PipelineDesc, Shader, VkError};

#[test]
fn a_required_subgroup_size_in_the_device_range_builds_and_others_are_refused() {
    let Some(ctx) = gpu_or_skip("required_subgroup_size") else {
        return;
    };
    let sg = ctx.caps().subgroup.clone();
    let ok = Pipeline::new(
        &ctx,
        &PipelineDesc::new(CONTROL_ADD, 3, 8).subgroup_size(sg.max_size),
    );
    assert_eq!(ok.is_ok(), sg.size_control, "{:?}", ok.err());
    let err = Pipeline::new(
        &ctx,
        &PipelineDesc::new(CONTROL_ADD, 3, 8).subgroup_size(sg.max_size * 4),
    )
    .err()
    .unwrap();
    assert!(
        matches!(err, VkError::Unsupported { .. }) && err.to_string().contains("subgroup size"),
        "{err}"
    );
    assert_no_validation_errors(&ctx);
}

#[test]
fn specialization_constants_and_labels_are_accepted() {
    let Some(ctx) = gpu_or_skip("specialization_constants") else {
        return;
    };
    let p = Pipeline::new(
        &ctx,
        &PipelineDesc::new(CONTROL_ADD, 3, 8)
            .spec(&[])
            .label("residual"),
    )
    .unwrap();
    assert_eq!(
        (p.label(), p.bindings(), p.push_constant_bytes()),
        ("residual", 3, 8)
    );
}

#[test]
fn malformed_spirv_is_a_clear_error() {
    let Some(ctx) = gpu_or_skip("malformed_spirv") else {
        return;
    };
    let bad = Shader {
        name: "broken",
        spirv: &[
            1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20,
        ],
    };
    let err = Pipeline::new(&ctx, &PipelineDesc::new(bad, 1, 0))
        .err()
        .unwrap();
    assert!(
        err.to_string().contains("broken") && err.to_string().contains("magic"),
        "{err}"
    );
    let short = Shader {
        name: "short",
        spirv: &[3, 2, 35, 7, 0],
    };
    assert!(matches!(
        Pipeline::new(&ctx, &PipelineDesc::new(short, 1, 0)),
        Err(VkError::BadSpirv { .. })
    ));
}

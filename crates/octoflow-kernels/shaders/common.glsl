// Helpers shared by the compute shaders. Include after the `local_size` layout declaration.

// Flat invocation index over a 2-D dispatch grid: rows of gl_NumWorkGroups.x groups, so element
// counts beyond maxComputeWorkGroupCount[0] * local_size_x still get one invocation each (the
// host side is octoflow_vk::grid_1d). Callers guard with `if (i < n)`.
uint global_index() {
    return (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * gl_WorkGroupSize.x
        + gl_LocalInvocationID.x;
}

// Workgroup reductions over subgroups. Include after the `local_size` layout; the including
// shader enables GL_KHR_shader_subgroup_basic and GL_KHR_shader_subgroup_arithmetic. Every
// invocation of the workgroup must call these (uniform control flow); all get the same result.
// No subgroup size is assumed: one slot per subgroup, at most one per invocation.

shared float red_buf[gl_WorkGroupSize.x];

float wg_sum(float v) {
    v = subgroupAdd(v);
    if (subgroupElect()) {
        red_buf[gl_SubgroupID] = v;
    }
    barrier();
    float s = 0.0;
    for (uint i = 0; i < gl_NumSubgroups; i++) {
        s += red_buf[i];
    }
    barrier();
    return s;
}

float wg_max(float v) {
    v = subgroupMax(v);
    if (subgroupElect()) {
        red_buf[gl_SubgroupID] = v;
    }
    barrier();
    float m = red_buf[0];
    for (uint i = 1; i < gl_NumSubgroups; i++) {
        m = max(m, red_buf[i]);
    }
    barrier();
    return m;
}

// Flat workgroup index over a 2-D grid (host side: octoflow_vk::grid_1d with local size 1).
uint flat_group() {
    return gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
}

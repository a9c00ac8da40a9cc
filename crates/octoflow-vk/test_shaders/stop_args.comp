#version 450
// Test kernel: writes indirect dispatch arguments, (groups, 1, 1) or (0, 1, 1) when the stop
// flag ctrl[0] is set, so the following indirect dispatch runs or does nothing.

layout(local_size_x = 1) in;

layout(std430, binding = 0) readonly buffer Ctrl { uint stop_flag; };
layout(std430, binding = 1) writeonly buffer Args { uint args[3]; };

layout(push_constant) uniform Push { uint groups; } pc;

void main() {
    args[0] = stop_flag != 0u ? 0u : pc.groups;
    args[1] = 1u;
    args[2] = 1u;
}

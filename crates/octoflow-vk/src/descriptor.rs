//! Descriptor sets for a chain: allocated from pools the chain owns, one set per distinct
//! (pipeline layout, bindings) pair, so a chain that repeats the same dispatch K times (decode
//! steps) reuses one set.

use std::collections::HashMap;

use ash::vk;

use crate::buffer::BufferSlice;
use crate::error::{vk_err, Result};

const SETS_PER_POOL: u32 = 128;
const BUFFERS_PER_POOL: u32 = SETS_PER_POOL * 8;

type Key = (vk::DescriptorSetLayout, Vec<(vk::Buffer, u64, u64)>);

/// Pools and the sets allocated from them; destroyed with the chain.
pub(crate) struct DescriptorArena {
    device: ash::Device,
    pools: Vec<vk::DescriptorPool>,
    sets: HashMap<Key, vk::DescriptorSet>,
}

impl DescriptorArena {
    pub(crate) fn new(device: &ash::Device) -> Self {
        DescriptorArena {
            device: device.clone(),
            pools: Vec::new(),
            sets: HashMap::new(),
        }
    }

    /// A set of `layout` with binding `i` = `bindings[i]`.
    pub(crate) fn set_for(
        &mut self,
        layout: vk::DescriptorSetLayout,
        bindings: &[BufferSlice],
    ) -> Result<vk::DescriptorSet> {
        let key: Key = (
            layout,
            bindings
                .iter()
                .map(|b| (b.buffer.raw(), b.offset, b.size))
                .collect(),
        );
        if let Some(&set) = self.sets.get(&key) {
            return Ok(set);
        }
        let set = self.allocate(layout)?;
        let infos: Vec<[vk::DescriptorBufferInfo; 1]> = bindings
            .iter()
            .map(|b| {
                [vk::DescriptorBufferInfo {
                    buffer: b.buffer.raw(),
                    offset: b.offset,
                    range: b.size,
                }]
            })
            .collect();
        let writes: Vec<_> = infos
            .iter()
            .enumerate()
            .map(|(i, info)| {
                vk::WriteDescriptorSet::default()
                    .dst_set(set)
                    .dst_binding(i as u32)
                    .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                    .buffer_info(info)
            })
            .collect();
        // SAFETY: the set is fresh and not in use; buffers are live (the chain keeps them).
        unsafe { self.device.update_descriptor_sets(&writes, &[]) };
        self.sets.insert(key, set);
        Ok(set)
    }

    fn allocate(&mut self, layout: vk::DescriptorSetLayout) -> Result<vk::DescriptorSet> {
        let layouts = [layout];
        if let Some(&pool) = self.pools.last() {
            let info = vk::DescriptorSetAllocateInfo::default()
                .descriptor_pool(pool)
                .set_layouts(&layouts);
            // SAFETY: pool and layout are live; exhaustion is reported as an error we handle.
            match unsafe { self.device.allocate_descriptor_sets(&info) } {
                Ok(sets) => return Ok(sets[0]),
                Err(vk::Result::ERROR_OUT_OF_POOL_MEMORY | vk::Result::ERROR_FRAGMENTED_POOL) => {}
                Err(e) => return Err(vk_err("vkAllocateDescriptorSets")(e)),
            }
        }
        let sizes = [vk::DescriptorPoolSize {
            ty: vk::DescriptorType::STORAGE_BUFFER,
            descriptor_count: BUFFERS_PER_POOL,
        }];
        let pool_info = vk::DescriptorPoolCreateInfo::default()
            .max_sets(SETS_PER_POOL)
            .pool_sizes(&sizes);
        // SAFETY: valid create info on a live device.
        let pool = unsafe { self.device.create_descriptor_pool(&pool_info, None) }
            .map_err(vk_err("vkCreateDescriptorPool"))?;
        self.pools.push(pool);
        let info = vk::DescriptorSetAllocateInfo::default()
            .descriptor_pool(pool)
            .set_layouts(&layouts);
        // SAFETY: fresh pool with room for one set of up to BUFFERS_PER_POOL buffers.
        let sets = unsafe { self.device.allocate_descriptor_sets(&info) }
            .map_err(vk_err("vkAllocateDescriptorSets"))?;
        Ok(sets[0])
    }
}

impl Drop for DescriptorArena {
    fn drop(&mut self) {
        // SAFETY: the owning chain waited for its last submit before dropping this.
        unsafe {
            for &pool in &self.pools {
                self.device.destroy_descriptor_pool(pool, None);
            }
        }
    }
}

//! Dispatch grid sizes.

use crate::context::Context;
use crate::error::{Result, VkError};

/// Workgroup counts covering `items` invocations of `local_size` each, as a 2-D grid of rows of
/// at most `max_x` groups (shaders flatten it with `global_index()` from `common.glsl` and guard
/// `i < n`). Errors when even the 2-D grid exceeds `max_y` rows.
pub fn groups_1d(items: u64, local_size: u32, max_x: u32, max_y: u32) -> Result<[u32; 3]> {
    let groups = items.div_ceil(u64::from(local_size.max(1))).max(1);
    let x = groups.min(u64::from(max_x.max(1)));
    let y = groups.div_ceil(x);
    if y > u64::from(max_y) {
        return Err(VkError::BadRange {
            what: "dispatch grid".into(),
            detail: format!("{items} items of {local_size} per group need {groups} groups, over {max_x}×{max_y}"),
        });
    }
    Ok([x as u32, y as u32, 1])
}

impl Context {
    /// [`groups_1d`] with this device's workgroup-count limits.
    pub fn groups_1d(&self, items: u64, local_size: u32) -> Result<[u32; 3]> {
        let [max_x, max_y, _] = self.caps().max_workgroup_count;
        groups_1d(items, local_size, max_x, max_y)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_counts_use_one_row() {
        assert_eq!(groups_1d(1000, 256, 65535, 65535).unwrap(), [4, 1, 1]);
        assert_eq!(groups_1d(0, 256, 65535, 65535).unwrap(), [1, 1, 1]);
    }

    #[test]
    fn large_counts_wrap_into_rows_that_cover_every_item() {
        let [x, y, _] = groups_1d(100_000_000, 256, 65535, 65535).unwrap();
        assert_eq!(x, 65535);
        assert!(u64::from(x) * u64::from(y) * 256 >= 100_000_000);
        assert!(u64::from(x) * u64::from(y - 1) * 256 < 100_000_000);
    }

    #[test]
    fn impossible_grids_are_errors() {
        assert!(groups_1d(u64::MAX / 2, 1, 10, 10).is_err());
    }
}

//! Folding adapters into a base model (implemented with the adapters in
//! `octoflow_model::adapter`; re-exported here for the export path).

pub use octoflow_model::adapter::{merge, merge_same_types, merged_file};

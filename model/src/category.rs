//! What device memory is made of: the [`Category`] of a block (parameters, gradients,
//! optimizer state, activations, temporaries, inputs, memory from before the trace, or
//! unknown) and [`CategoryBytes`], bytes per category at one moment.
//!
//! Every live block is, at every moment, in exactly one category, so the categories of a moment
//! add up to its allocated bytes. A category is decided from what a trace shows (its stacks,
//! its phases, the blocks' lifetimes, a tag the program gave) and from nothing else: where the
//! evidence is absent the answer is [`Category::Unknown`], never a guess. The classification
//! itself belongs to the analysis; this module holds the names, the order every chart and
//! legend draws them in, the one text line that says a moment's composition, and the mapping
//! from the tags a program gives its allocations ([`Category::from_tag`]).

use std::fmt;
use std::ops::{AddAssign, Index, IndexMut};

use serde::de::{MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// What a block of device memory holds. The variants are declared in the order charts stack
/// them and legends and text lines list them ([`Category::ALL`]), which is also their index in
/// a [`CategoryBytes`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Category {
    /// Tensors saved by a forward pass for its backward pass: made in the forward (by the
    /// model's modules, with gradients enabled) and freed in the backward that consumes them.
    /// A forward under `no_grad` saves nothing, so its outputs are temporaries, not
    /// activations. A forward run inside `optimizer.step(closure)` makes activations too: the
    /// closure's forward is a forward, not optimizer state.
    Activations,
    /// The model's weights and buffers: made once before the first step (by `Module.to`,
    /// `Module._apply`, `load_state_dict`, a module's constructor on the device) and kept
    /// across steps.
    Parameters,
    /// State an optimizer keeps between steps (AdamW's `exp_avg` and `exp_avg_sq`, momentum
    /// buffers): made inside an optimizer's `step` (`torch/optim/` frames, the
    /// `Optimizer.step#…` annotation), outside any closure it calls, and kept across steps.
    OptimizerState,
    /// The `.grad` of parameters: made in the backward pass by `AccumulateGrad` (or a
    /// `*Backward` node's output that `AccumulateGrad` keeps as the gradient) and kept after
    /// it until `zero_grad` frees or zeroes them, or the next backward accumulates into them.
    Gradients,
    /// Memory made and freed within one phase (a forward's intermediate results that the
    /// backward does not need, a backward node's scratch and its incoming gradients, an
    /// optimizer step's foreach scratch): never outlives the phase that made it.
    Temporaries,
    /// Batches copied to the device (`.to(device)`, `.cuda()`, `pin_memory` copies of a
    /// batch) before the forward that reads them.
    Inputs,
    /// Blocks that were live when recording began: the trace holds no allocation for them,
    /// so nothing it shows says what they are.
    BeforeTrace,
    /// A block whose trace shows no evidence of what it is.
    Unknown,
}

impl Category {
    /// Every category, in the order charts stack them and legends and text list them.
    pub const ALL: [Category; 8] = [
        Category::Activations,
        Category::Parameters,
        Category::OptimizerState,
        Category::Gradients,
        Category::Temporaries,
        Category::Inputs,
        Category::BeforeTrace,
        Category::Unknown,
    ];

    /// How many categories there are.
    pub const COUNT: usize = Category::ALL.len();

    /// The category's place in [`Category::ALL`] and in a [`CategoryBytes`].
    pub const fn index(self) -> usize {
        self as usize
    }

    /// The name JSON and the wire write (`optimizer_state`).
    pub const fn as_str(self) -> &'static str {
        match self {
            Category::Activations => "activations",
            Category::Parameters => "parameters",
            Category::OptimizerState => "optimizer_state",
            Category::Gradients => "gradients",
            Category::Temporaries => "temporaries",
            Category::Inputs => "inputs",
            Category::BeforeTrace => "before_trace",
            Category::Unknown => "unknown",
        }
    }

    /// The name a reader sees in text, legends and charts (`optimizer state`).
    pub const fn label(self) -> &'static str {
        match self {
            Category::Activations => "activations",
            Category::Parameters => "parameters",
            Category::OptimizerState => "optimizer state",
            Category::Gradients => "gradients",
            Category::Temporaries => "temporaries",
            Category::Inputs => "inputs",
            Category::BeforeTrace => "before trace",
            Category::Unknown => "unknown",
        }
    }

    /// The category named `name` as JSON writes it ([`Category::as_str`]).
    pub fn from_name(name: &str) -> Option<Category> {
        Category::ALL.into_iter().find(|c| c.as_str() == name)
    }

    /// The category a program's own tag for an allocation names, where it names one: the tag
    /// (or, for a tag of the form `kind:detail` such as `param:encoder.0.weight`, its part
    /// before the first `:`), trimmed and without regard to case, is one of
    ///
    /// - `param`, `params`, `parameter`, `parameters`, `weight`, `weights`: parameters;
    /// - `grad`, `grads`, `gradient`, `gradients`: gradients;
    /// - `optim`, `optimizer`, `optimizer_state`, `optimizer state`, `optim_state`,
    ///   `opt_state`, `adam`, `adamw`: optimizer state;
    /// - `activation`, `activations`: activations;
    /// - `temp`, `temporary`, `temporaries`, `scratch`, `workspace`: temporaries;
    /// - `input`, `inputs`, `batch`: inputs.
    ///
    /// Any other tag names no category (`None`): a tag says what a block is only where it
    /// says so, and `before_trace` and `unknown` are never a program's to give. The name of
    /// every other category ([`Category::as_str`]) is among the tags above, so a program can
    /// tag with `alloc.tagged(Category::Gradients.as_str())`.
    ///
    /// ```
    /// use vramscope_model::Category;
    ///
    /// assert_eq!(Category::from_tag("weights"), Some(Category::Parameters));
    /// assert_eq!(Category::from_tag("Grad:fc1.weight"), Some(Category::Gradients));
    /// assert_eq!(Category::from_tag("loss"), None);
    /// ```
    pub fn from_tag(tag: &str) -> Option<Category> {
        let kind = tag.split(':').next().unwrap_or(tag).trim();
        let kind = kind.to_ascii_lowercase();
        Some(match kind.as_str() {
            "param" | "params" | "parameter" | "parameters" | "weight" | "weights" => {
                Category::Parameters
            }
            "grad" | "grads" | "gradient" | "gradients" => Category::Gradients,
            "optim" | "optimizer" | "optimizer_state" | "optimizer state" | "optim_state"
            | "opt_state" | "adam" | "adamw" => Category::OptimizerState,
            "activation" | "activations" => Category::Activations,
            "temp" | "temporary" | "temporaries" | "scratch" | "workspace" => Category::Temporaries,
            "input" | "inputs" | "batch" => Category::Inputs,
            _ => return None,
        })
    }

    /// The category a scope path (`train/optimizer/adam`, as a snapshot's scope table holds
    /// it) names: that of its innermost part that names one by [`Category::from_tag`]'s
    /// rule, or `None` when no part does.
    ///
    /// ```
    /// use vramscope_model::Category;
    ///
    /// assert_eq!(Category::from_scope("train/optimizer"), Some(Category::OptimizerState));
    /// assert_eq!(Category::from_scope("weights/layer3/scratch"), Some(Category::Temporaries));
    /// assert_eq!(Category::from_scope("train/forward"), None);
    /// ```
    pub fn from_scope(path: &str) -> Option<Category> {
        path.rsplit('/').find_map(Category::from_tag)
    }
}

impl fmt::Display for Category {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// Bytes per [`Category`] at one moment: a fixed array indexed by category, read with
/// `bytes[Category::Gradients]`, listed in [`Category::ALL`]'s order. It is written to JSON as
/// an object with every category's name ([`Category::as_str`]) in that order, and read from
/// one where a missing category is 0.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CategoryBytes([u64; Category::COUNT]);

impl CategoryBytes {
    /// No bytes in any category.
    pub const fn new() -> CategoryBytes {
        CategoryBytes([0; Category::COUNT])
    }

    /// The bytes of `category`.
    pub fn get(&self, category: Category) -> u64 {
        self.0[category.index()]
    }

    /// Adds `bytes` to `category` (saturating).
    pub fn add(&mut self, category: Category, bytes: u64) {
        let slot = &mut self.0[category.index()];
        *slot = slot.saturating_add(bytes);
    }

    /// Takes `bytes` from `category` (saturating at 0).
    pub fn sub(&mut self, category: Category, bytes: u64) {
        let slot = &mut self.0[category.index()];
        *slot = slot.saturating_sub(bytes);
    }

    /// The bytes of every category together (saturating).
    pub fn total(&self) -> u64 {
        self.0.iter().fold(0u64, |sum, &b| sum.saturating_add(b))
    }

    /// Every category with its bytes, in [`Category::ALL`]'s order, zeros included.
    pub fn iter(&self) -> impl Iterator<Item = (Category, u64)> + '_ {
        Category::ALL.into_iter().map(|c| (c, self.get(c)))
    }

    /// The categories that hold bytes, with their bytes, in [`Category::ALL`]'s order.
    pub fn nonzero(&self) -> impl Iterator<Item = (Category, u64)> + '_ {
        self.iter().filter(|&(_, b)| b > 0)
    }

    /// The bytes as an array indexed by [`Category::index`].
    pub fn as_array(&self) -> &[u64; Category::COUNT] {
        &self.0
    }

    /// The moment's composition in one line: the total as [`crate::format_bytes`] writes it,
    /// then each category that holds bytes, in [`Category::ALL`]'s order, in the total's unit
    /// with one decimal (`<0.1` for a part too small to show; whole bytes when the total is
    /// under 1 KiB): `12.4 GiB: activations 7.1, parameters 1.9, optimizer state 2.5`. With no
    /// bytes at all it is `0 B`. A report puts what the moment is in front (`at the peak`).
    ///
    /// ```
    /// use vramscope_model::{Category, CategoryBytes};
    ///
    /// let mut bytes = CategoryBytes::new();
    /// bytes.add(Category::Parameters, 3 << 30);
    /// bytes.add(Category::Activations, 5 << 29);
    /// bytes.add(Category::Temporaries, 1 << 20);
    /// assert_eq!(
    ///     bytes.summary(),
    ///     "5.50 GiB: activations 2.5, parameters 3.0, temporaries <0.1"
    /// );
    /// ```
    pub fn summary(&self) -> String {
        let total = self.total();
        let mut line = crate::format_bytes(total);
        let unit = unit_of(total);
        let mut first = true;
        for (category, bytes) in self.nonzero() {
            line.push_str(if first { ": " } else { ", " });
            first = false;
            line.push_str(category.label());
            line.push(' ');
            line.push_str(&part_in_unit(bytes, unit));
        }
        line
    }
}

/// The power of 1024 that [`crate::format_bytes`] writes `bytes` in (0 for bytes, 1 for KiB,
/// ..., 5 for PiB).
fn unit_of(bytes: u64) -> u32 {
    let mut unit = 0;
    let mut value = bytes as f64;
    while value >= 1024.0 && unit < 5 {
        value /= 1024.0;
        unit += 1;
    }
    unit
}

/// `bytes` in units of 1024^`unit`, with one decimal, `<0.1` when that shows no bytes at
/// all; whole bytes for unit 0.
fn part_in_unit(bytes: u64, unit: u32) -> String {
    if unit == 0 {
        return bytes.to_string();
    }
    let value = bytes as f64 / f64::powi(1024.0, unit as i32);
    if value < 0.05 {
        "<0.1".to_string()
    } else {
        format!("{value:.1}")
    }
}

impl Index<Category> for CategoryBytes {
    type Output = u64;

    fn index(&self, category: Category) -> &u64 {
        &self.0[category.index()]
    }
}

impl IndexMut<Category> for CategoryBytes {
    fn index_mut(&mut self, category: Category) -> &mut u64 {
        &mut self.0[category.index()]
    }
}

impl AddAssign for CategoryBytes {
    fn add_assign(&mut self, other: CategoryBytes) {
        for (category, bytes) in other.iter() {
            self.add(category, bytes);
        }
    }
}

impl FromIterator<(Category, u64)> for CategoryBytes {
    fn from_iter<I: IntoIterator<Item = (Category, u64)>>(iter: I) -> CategoryBytes {
        let mut bytes = CategoryBytes::new();
        for (category, b) in iter {
            bytes.add(category, b);
        }
        bytes
    }
}

impl Serialize for CategoryBytes {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(Category::COUNT))?;
        for (category, bytes) in self.iter() {
            map.serialize_entry(category.as_str(), &bytes)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for CategoryBytes {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<CategoryBytes, D::Error> {
        struct Bytes;

        impl<'de> Visitor<'de> for Bytes {
            type Value = CategoryBytes;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object of bytes by category name")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<CategoryBytes, A::Error> {
                let mut bytes = CategoryBytes::new();
                while let Some((name, value)) = map.next_entry::<String, u64>()? {
                    let category = Category::from_name(&name).ok_or_else(|| {
                        serde::de::Error::custom(format!(
                            "`{name}` is not a category (one of {})",
                            Category::ALL.map(Category::as_str).join(", ")
                        ))
                    })?;
                    bytes[category] = value;
                }
                Ok(bytes)
            }
        }

        deserializer.deserialize_map(Bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn the_eight_categories_in_their_order_with_their_names() {
        let names: Vec<&str> = Category::ALL.iter().map(|c| c.as_str()).collect();
        assert_eq!(
            names,
            [
                "activations",
                "parameters",
                "optimizer_state",
                "gradients",
                "temporaries",
                "inputs",
                "before_trace",
                "unknown"
            ]
        );
        for (i, c) in Category::ALL.into_iter().enumerate() {
            assert_eq!(c.index(), i);
            assert_eq!(Category::from_name(c.as_str()), Some(c));
            // Serde writes the same name as `as_str`.
            assert_eq!(
                serde_json::to_string(&c).unwrap(),
                format!("\"{}\"", c.as_str())
            );
            let back: Category = serde_json::from_str(&format!("\"{}\"", c.as_str())).unwrap();
            assert_eq!(back, c);
        }
        assert_eq!(Category::OptimizerState.to_string(), "optimizer state");
        assert_eq!(Category::BeforeTrace.label(), "before trace");
        assert!(Category::from_name("weights").is_none());
        // The derived order is the chart order.
        let mut sorted = Category::ALL;
        sorted.sort();
        assert_eq!(sorted, Category::ALL);
    }

    #[test]
    fn bytes_add_up_and_list_in_order() {
        let mut bytes = CategoryBytes::new();
        bytes.add(Category::Gradients, 600);
        bytes.add(Category::Parameters, 1900);
        bytes[Category::Activations] += 7100;
        bytes.sub(Category::Gradients, 100);
        bytes.sub(Category::Unknown, 5);
        assert_eq!(bytes.total(), 9500);
        assert_eq!(bytes[Category::Gradients], 500);
        assert_eq!(bytes.get(Category::Unknown), 0);
        let listed: Vec<(Category, u64)> = bytes.nonzero().collect();
        assert_eq!(
            listed,
            [
                (Category::Activations, 7100),
                (Category::Parameters, 1900),
                (Category::Gradients, 500)
            ]
        );
        assert_eq!(bytes.iter().count(), Category::COUNT);
        let mut doubled = bytes;
        doubled += bytes;
        assert_eq!(doubled.total(), 19_000);
        let collected: CategoryBytes = bytes.nonzero().collect();
        assert_eq!(collected, bytes);
        let mut full = CategoryBytes::new();
        full.add(Category::Inputs, u64::MAX);
        full.add(Category::Inputs, 1);
        full.add(Category::Unknown, 1);
        assert_eq!(full.total(), u64::MAX, "sums saturate");
    }

    #[test]
    fn the_text_line_writes_each_category_in_the_totals_unit() {
        let mut bytes = CategoryBytes::new();
        // The issue's example, in tenths of a GiB.
        for (category, tenths) in [
            (Category::Activations, 71),
            (Category::Parameters, 19),
            (Category::OptimizerState, 25),
            (Category::Gradients, 6),
            (Category::Temporaries, 3),
        ] {
            bytes.add(category, tenths * GIB / 10);
        }
        assert_eq!(
            bytes.summary(),
            "12.4 GiB: activations 7.1, parameters 1.9, optimizer state 2.5, gradients 0.6, temporaries 0.3"
        );
        bytes.add(Category::Unknown, 4096);
        assert!(
            bytes.summary().ends_with(", unknown <0.1"),
            "{}",
            bytes.summary()
        );
        assert_eq!(CategoryBytes::new().summary(), "0 B");
        let mut small = CategoryBytes::new();
        small.add(Category::Inputs, 512);
        small.add(Category::BeforeTrace, 100);
        assert_eq!(small.summary(), "612 B: inputs 512, before trace 100");
        let mut mib = CategoryBytes::new();
        mib.add(Category::Parameters, 3 << 20);
        mib.add(Category::Gradients, 1 << 19);
        assert_eq!(mib.summary(), "3.50 MiB: parameters 3.0, gradients 0.5");
    }

    #[test]
    fn bytes_are_an_object_of_every_category_in_json() {
        let mut bytes = CategoryBytes::new();
        bytes.add(Category::OptimizerState, 42);
        let text = serde_json::to_string(&bytes).unwrap();
        assert_eq!(
            text,
            r#"{"activations":0,"parameters":0,"optimizer_state":42,"gradients":0,"temporaries":0,"inputs":0,"before_trace":0,"unknown":0}"#
        );
        let back: CategoryBytes = serde_json::from_str(&text).unwrap();
        assert_eq!(back, bytes);
        let partial: CategoryBytes = serde_json::from_str(r#"{"inputs":7}"#).unwrap();
        assert_eq!(partial.total(), 7);
        assert_eq!(partial[Category::Inputs], 7);
        let err = serde_json::from_str::<CategoryBytes>(r#"{"weights":7}"#).unwrap_err();
        assert!(
            err.to_string().contains("`weights` is not a category"),
            "{err}"
        );
    }

    #[test]
    fn tags_and_scopes_name_a_category_only_where_they_say_so() {
        for (tag, category) in [
            ("param", Category::Parameters),
            ("Weights", Category::Parameters),
            (" parameters ", Category::Parameters),
            ("weight:fc1", Category::Parameters),
            ("grad", Category::Gradients),
            ("gradients:fc1.weight", Category::Gradients),
            ("optim", Category::OptimizerState),
            ("optimizer", Category::OptimizerState),
            ("optimizer_state", Category::OptimizerState),
            ("opt_state:exp_avg", Category::OptimizerState),
            ("activation", Category::Activations),
            ("ACTIVATIONS", Category::Activations),
            ("temp", Category::Temporaries),
            ("workspace", Category::Temporaries),
            ("input", Category::Inputs),
            ("batch", Category::Inputs),
            ("adam", Category::OptimizerState),
        ] {
            assert_eq!(Category::from_tag(tag), Some(category), "{tag:?}");
        }
        for tag in [
            "",
            "loss",
            "kv_cache",
            "weightsx",
            "gradual",
            "before_trace",
            "unknown",
            "forward",
            "fc1:weight",
        ] {
            assert_eq!(Category::from_tag(tag), None, "{tag:?}");
        }
        assert_eq!(
            Category::from_scope("step/optimizer"),
            Some(Category::OptimizerState)
        );
        assert_eq!(
            Category::from_scope("params/layer/scratch"),
            Some(Category::Temporaries)
        );
        assert_eq!(
            Category::from_scope("grads/layer3"),
            Some(Category::Gradients)
        );
        assert_eq!(Category::from_scope(""), None);
        assert_eq!(Category::from_scope("train/forward/layer3"), None);
    }
}

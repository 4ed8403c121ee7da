//! A service's settings in layers: the type's defaults (`#[serde(default)]`), then its TOML
//! file, then the environment variables its fields name (`#[env("NAME")]`, see
//! [`Settings`]). The file's keys and the variables' values are handed to the type's own
//! `Deserialize` as one map, so a variable's text is read as the field's type asks (a
//! number, an enum's variant, a path, a secret) and every check the type has applies to both
//! layers alike. An error says which layer it came from: the file's key, or the variable.

use super::Connections;
use serde::de::value::Error;
use serde::de::{self, DeserializeOwned, DeserializeSeed, IntoDeserializer, MapAccess, Visitor};
use serde::forward_to_deserialize_any;
use std::collections::BTreeMap;
use std::path::Path;

/// A settings type: the environment variables that set its fields. Derive it with
/// `#[derive(Settings)]` and `#[env("NAME")]` on each field a variable sets.
pub trait Settings {
    /// The variables that set the type's fields, as the derive gathers them.
    const ENV: &'static [EnvVar];
}

/// An environment variable that sets a key of a settings type.
pub struct EnvVar {
    /// The variable's name (`NATS_URL`).
    pub name: &'static str,
    /// The key (the field) it sets, at the type's top level.
    pub key: &'static str,
    /// Its form, when it has one of its own: its text as the value the file would hold.
    /// Without one, the text is read as the field's type asks.
    pub parse: Option<fn(&str) -> anyhow::Result<toml::Value>>,
    /// An empty value is given to the field's checks instead of counting as unset.
    pub keep_empty: bool,
}

/// Reads environment variables by name; the process's are [`process_env`], tests give their
/// own (setting the process's is unsafe while other threads read them).
pub type Env<'a> = &'a dyn Fn(&str) -> Option<String>;

/// The process's environment variables.
pub fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// Reads a service's settings and the connection settings beside them at its file's top
/// level: defaults, then the file (none: the defaults), then the environment.
pub fn load<T: Settings + DeserializeOwned>(
    path: Option<&Path>,
    env: Env,
) -> anyhow::Result<(T, Connections)> {
    let (file, origin) = match path {
        None => (toml::Table::new(), "invalid config".to_string()),
        Some(path) => {
            let origin = format!("invalid config {}", path.display());
            let text = std::fs::read_to_string(path)
                .map_err(|e| anyhow::anyhow!("cannot read config {}: {e}", path.display()))?;
            let file = text.parse().map_err(|e| anyhow::anyhow!("{origin}: {e}"))?;
            (file, origin)
        }
    };
    split(file, &origin, env)
}

/// [`load`] with the file's text.
pub fn parse<T: Settings + DeserializeOwned>(
    text: &str,
    env: Env,
) -> anyhow::Result<(T, Connections)> {
    let origin = "invalid config";
    let file = text.parse().map_err(|e| anyhow::anyhow!("{origin}: {e}"))?;
    split(file, origin, env)
}

impl Connections {
    /// The defaults and the environment, for a process with no config file.
    pub fn from_env(env: Env) -> anyhow::Result<Self> {
        let connections: Self = layer(toml::Table::new(), "invalid config", env)?;
        connections.validate()?;
        Ok(connections)
    }
}

/// Parts the file's top level into the connection settings and the service's own keys, and
/// reads each with its variables.
fn split<T: Settings + DeserializeOwned>(
    mut file: toml::Table,
    origin: &str,
    env: Env,
) -> anyhow::Result<(T, Connections)> {
    let mut own = toml::Table::new();
    for key in super::keys::fields::<Connections>() {
        if let Some(value) = file.remove(*key) {
            own.insert(key.to_string(), value);
        }
    }
    let connections: Connections = layer(own, origin, env)?;
    connections.validate()?;
    Ok((layer(file, origin, env)?, connections))
}

/// Reads `T` from the file's keys and, over them, its variables that are set and not empty
/// (or empty, for one that keeps an empty value);
/// a key `T` does not know is refused by name (it would otherwise be ignored and its default
/// used).
fn layer<T: Settings + DeserializeOwned>(
    file: toml::Table,
    origin: &str,
    env: Env,
) -> anyhow::Result<T> {
    let mut entries: BTreeMap<String, Layer> = file
        .into_iter()
        .map(|(key, value)| (key, Layer::File(value)))
        .collect();
    for var in T::ENV {
        let Some(text) = env(var.name).filter(|text| var.keep_empty || !text.is_empty()) else {
            continue;
        };
        let layer = match var.parse {
            None => Layer::Text(var.name, text),
            Some(parse) => {
                let mut value = parse(&text)
                    .map_err(|e| anyhow::anyhow!("environment variable {}: {e}", var.name))?;
                // A variable that sets some keys of a table leaves the file's others.
                if let (toml::Value::Table(over), Some(Layer::File(toml::Value::Table(under)))) =
                    (&mut value, entries.get(var.key))
                {
                    let mut merged = under.clone();
                    merged.extend(std::mem::take(over));
                    *over = merged;
                }
                Layer::Parsed(var.name, value)
            }
        };
        entries.insert(var.key.to_string(), layer);
    }
    let mut unknown = Vec::new();
    let layers = Layers {
        entries: entries.into_iter(),
        value: None,
        origin,
    };
    let value = serde_ignored::deserialize(layers, |path| unknown.push(path.to_string()))?;
    anyhow::ensure!(
        unknown.is_empty(),
        "{origin}: unknown key {}",
        unknown.join(", ")
    );
    Ok(value)
}

/// Where one top-level key's value came from.
enum Layer {
    File(toml::Value),
    /// A variable's text, read as the key's type asks.
    Text(&'static str, String),
    /// A variable of a form of its own, as the file would hold it.
    Parsed(&'static str, toml::Value),
}

/// The merged top level, as a map for `Deserialize`.
struct Layers<'a> {
    entries: std::collections::btree_map::IntoIter<String, Layer>,
    value: Option<(String, Layer)>,
    origin: &'a str,
}

impl<'de> de::Deserializer<'de> for Layers<'_> {
    type Error = Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_map(self)
    }

    forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map struct enum
        identifier ignored_any
    }
}

impl<'de> MapAccess<'de> for Layers<'_> {
    type Error = Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Error> {
        let Some((key, layer)) = self.entries.next() else {
            return Ok(None);
        };
        let read = seed.deserialize(key.as_str().into_deserializer()).map(Some);
        self.value = Some((key, layer));
        read
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Error> {
        let (key, layer) = self
            .value
            .take()
            .ok_or_else(|| de::Error::custom("a value without its key"))?;
        let (place, read) = match layer {
            Layer::File(value) => (
                format!("{}: {key}", self.origin),
                seed.deserialize(value).map_err(|e| e.to_string()),
            ),
            Layer::Text(var, text) => (
                format!("environment variable {var}"),
                seed.deserialize(Plain(&text)).map_err(|e| e.to_string()),
            ),
            Layer::Parsed(var, value) => (
                format!("environment variable {var}"),
                seed.deserialize(value).map_err(|e| e.to_string()),
            ),
        };
        // toml's messages end in a line break.
        read.map_err(|e| de::Error::custom(format!("{place}: {}", e.trim_end())))
    }
}

/// A variable's text, read as the type it sets asks: a number or a truth value parsed, an
/// enum's variant by its name, anything else the text itself.
struct Plain<'a>(&'a str);

impl Plain<'_> {
    fn parse<T: std::str::FromStr>(&self, what: &str) -> Result<T, Error> {
        self.0
            .parse()
            .map_err(|_| de::Error::custom(format!("{:?} is not {what}", self.0)))
    }
}

macro_rules! parse_as {
    ($($method:ident $visit:ident $what:literal),* $(,)?) => {
        $(fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
            visitor.$visit(self.parse($what)?)
        })*
    };
}

impl<'de> de::Deserializer<'de> for Plain<'_> {
    type Error = Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_str(self.0)
    }

    parse_as! {
        deserialize_bool visit_bool "true or false",
        deserialize_i8 visit_i8 "a number", deserialize_i16 visit_i16 "a number",
        deserialize_i32 visit_i32 "a number", deserialize_i64 visit_i64 "a number",
        deserialize_u8 visit_u8 "a number", deserialize_u16 visit_u16 "a number",
        deserialize_u32 visit_u32 "a number", deserialize_u64 visit_u64 "a number",
        deserialize_f32 visit_f32 "a number", deserialize_f64 visit_f64 "a number",
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_some(self)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Error> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        visitor.visit_enum(self.0.into_deserializer())
    }

    forward_to_deserialize_any! {
        i128 u128 char str string bytes byte_buf unit unit_struct seq tuple tuple_struct map
        struct identifier ignored_any
    }
}

/// The config file named by `--config PATH` on the command line or `COUNTERSIGN_CONFIG`.
pub fn config_path_from_args() -> Option<std::path::PathBuf> {
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        if arg == "--config" {
            return args.next().map(Into::into);
        }
    }
    std::env::var_os("COUNTERSIGN_CONFIG").map(Into::into)
}

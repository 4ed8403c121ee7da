//! The keys a settings type reads, learnt from its own `Deserialize` (serde names a struct's
//! fields to the deserializer before reading any), so no list of them is written by hand: the
//! loader tells the connection settings from a service's keys with it, and tests hold each
//! service's example file and the configuration page to the types with [`check_example`] and
//! [`check_env_table`].

use super::{Connections, Settings};
use serde::de::value::Error;
use serde::de::{self, DeserializeOwned, DeserializeSeed, IntoDeserializer, MapAccess, SeqAccess};
use serde::de::{Deserializer, Visitor};
use serde::forward_to_deserialize_any;
use std::cell::Cell;
use std::collections::BTreeSet;

type Fields = &'static [&'static str];

/// The keys of `T`'s top level.
pub fn fields<T: DeserializeOwned>() -> Fields {
    fields_at::<T>(&[]).unwrap_or_default()
}

/// Every key `T` reads, tables' keys as `table.key` (an array of tables, such as
/// `[[people]]`, counts as one table).
pub fn keys<T: DeserializeOwned>() -> BTreeSet<String> {
    let mut keys = BTreeSet::new();
    let mut tables = vec![Vec::new()];
    while let Some(table) = tables.pop() {
        for field in fields_at::<T>(&table).unwrap_or_default() {
            let mut path = table.clone();
            path.push(*field);
            keys.insert(path.join("."));
            tables.push(path);
        }
    }
    keys
}

/// The fields of the struct at `path` in `T`, if it is one: `T` is read from a map holding
/// only the path's first key, whose value holds only the next, and so on, until the struct
/// there names its fields. Reading stops with an error there or at any other value, which
/// is all this needs.
fn fields_at<T: DeserializeOwned>(path: &[&'static str]) -> Option<Fields> {
    let found = Cell::new(None);
    let _ = T::deserialize(Probe {
        path,
        found: &found,
    });
    found.get()
}

struct Probe<'a> {
    path: &'a [&'static str],
    found: &'a Cell<Option<Fields>>,
}

fn stop() -> Error {
    de::Error::custom("probed")
}

impl<'de> Deserializer<'de> for Probe<'_> {
    type Error = Error;

    fn deserialize_any<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, Error> {
        Err(stop())
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: Fields,
        visitor: V,
    ) -> Result<V::Value, Error> {
        let Some((first, path)) = self.path.split_first() else {
            self.found.set(Some(fields));
            return Err(stop());
        };
        visitor.visit_map(Step {
            key: Some(first),
            value: Some(Probe {
                path,
                found: self.found,
            }),
        })
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

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_seq(Step {
            key: None,
            value: Some(self),
        })
    }

    forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        unit unit_struct tuple tuple_struct map enum identifier ignored_any
    }
}

/// One key and its value (a struct's), or one element (a sequence's).
struct Step<'a> {
    key: Option<&'a &'static str>,
    value: Option<Probe<'a>>,
}

impl<'de> MapAccess<'de> for Step<'_> {
    type Error = Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Error> {
        self.key
            .take()
            .map(|key| seed.deserialize(IntoDeserializer::<Error>::into_deserializer(*key)))
            .transpose()
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Error> {
        seed.deserialize(self.value.take().ok_or_else(stop)?)
    }
}

impl<'de> SeqAccess<'de> for Step<'_> {
    type Error = Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Error> {
        self.value
            .take()
            .map(|probe| seed.deserialize(probe))
            .transpose()
    }
}

/// Holds a service's example file to its settings (`T` and the connection settings beside
/// it): every key they read, in tables too, is in the example, set or commented out as
/// `# key = …` (a table as `# [table]`); every key there is one they read; every
/// environment variable they name is mentioned.
pub fn check_example<T: Settings + DeserializeOwned>(example: &str) -> Result<(), String> {
    let known: BTreeSet<String> = keys::<Connections>()
        .into_iter()
        .chain(keys::<T>())
        .collect();
    let uncommented: Vec<&str> = example
        .lines()
        .map(|line| match line.strip_prefix("# ") {
            Some(setting) if is_setting(setting) => setting,
            _ => line,
        })
        .collect();
    let table: toml::Table = uncommented
        .join("\n")
        .parse()
        .map_err(|e| format!("the example with its settings uncommented: {e}"))?;
    let mut found = BTreeSet::new();
    collect(&table, "", &known, &mut found);
    let mut faults: Vec<String> = known
        .difference(&found)
        .map(|key| format!("{key} is not in the example"))
        .collect();
    faults.extend(
        found
            .difference(&known)
            .map(|key| format!("{key} in the example is no setting")),
    );
    faults.extend(
        env_vars::<T>()
            .filter(|var| !example.contains(var.name))
            .map(|var| format!("the example does not name {}", var.name)),
    );
    if faults.is_empty() {
        Ok(())
    } else {
        Err(faults.join("\n"))
    }
}

/// A commented-out line that is a setting: `key = value`, `[table]` or `[[table]]`.
fn is_setting(line: &str) -> bool {
    let table = line.starts_with('[') && line.trim_end().ends_with(']');
    let key = line.split_once(" = ").is_some_and(|(key, _)| {
        !key.is_empty()
            && key
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
    });
    table || key
}

/// The keys of `table`, and of the tables in it at paths that `known` has keys under.
fn collect(
    table: &toml::Table,
    prefix: &str,
    known: &BTreeSet<String>,
    found: &mut BTreeSet<String>,
) {
    for (key, value) in table {
        let path = if prefix.is_empty() {
            key.clone()
        } else {
            format!("{prefix}.{key}")
        };
        let inner = format!("{path}.");
        if known.iter().any(|known| known.starts_with(&inner)) {
            let tables: Vec<&toml::Table> = match value {
                toml::Value::Table(table) => vec![table],
                toml::Value::Array(items) => {
                    items.iter().filter_map(toml::Value::as_table).collect()
                }
                _ => Vec::new(),
            };
            for table in tables {
                collect(table, &path, known, found);
            }
        }
        found.insert(path);
    }
}

/// The environment variables of `T` and of the connection settings.
fn env_vars<T: Settings>() -> impl Iterator<Item = &'static super::EnvVar> {
    Connections::ENV.iter().chain(T::ENV)
}

/// Holds the configuration page's table of environment variables to a service's settings:
/// each variable `T` and the connection settings name has a row (`` | `NAME` | `key` |
/// service |``) naming its key and `both` or `service`.
pub fn check_env_table<T: Settings>(page: &str, service: &str) -> Result<(), String> {
    let rows: Vec<Vec<&str>> = page
        .lines()
        .filter(|line| line.starts_with('|'))
        .map(|line| line.split('|').map(str::trim).skip(1).collect())
        .collect();
    let faults: Vec<String> = env_vars::<T>()
        .filter(|var| {
            let name = format!("`{}`", var.name);
            let key = format!("`{}`", var.key);
            !rows.iter().any(|row| {
                matches!(row[..], [names, keys, serves, ..]
                    if names.split(", ").any(|n| n == name)
                        && keys.contains(&key)
                        && (serves == "both" || serves == service))
            })
        })
        .map(|var| {
            format!(
                "no row says {} sets `{}` of the {service}",
                var.name, var.key
            )
        })
        .collect();
    if faults.is_empty() {
        Ok(())
    } else {
        Err(faults.join("\n"))
    }
}

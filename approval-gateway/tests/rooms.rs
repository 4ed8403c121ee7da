//! The gateway's rooms and who may import whom, as ARCHITECTURE.md writes them (its table
//! "The gateway's rooms"), held against every `crate::` path in `src/`: a file may name its
//! own room and the rooms its room's line lists, nothing else, and a room without a line fails
//! too. A room is a top-level file or folder of `src/`; each door (`doors/api`, `doors/inbox`,
//! …) is a room of its own, so no door imports another unless its line says so.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const HEADING: &str = "## The gateway's rooms";
/// What a line's "may import" cell says when the room imports nothing of the gateway.
const NOTHING: &str = "nothing";

/// Each room's line: the rooms it may import.
fn rules(architecture: &str) -> BTreeMap<String, BTreeSet<String>> {
    let section = architecture
        .split_once(HEADING)
        .unwrap_or_else(|| panic!("ARCHITECTURE.md has no {HEADING:?} section"))
        .1;
    let mut rules = BTreeMap::new();
    for line in section.lines().skip_while(|l| !l.starts_with('|')) {
        if !line.starts_with('|') {
            break;
        }
        let cells: Vec<&str> = line.trim_matches('|').split('|').collect();
        let (Some(rooms), Some(may)) = (cells.first(), cells.last()) else {
            continue;
        };
        let may = if may.trim() == NOTHING {
            BTreeSet::new()
        } else {
            quoted(may)
        };
        for room in quoted(rooms) {
            rules.insert(room, may.clone());
        }
    }
    assert!(!rules.is_empty(), "the {HEADING:?} table has no rows");
    rules
}

/// The `backticked` names of a cell.
fn quoted(cell: &str) -> BTreeSet<String> {
    cell.split('`')
        .skip(1)
        .step_by(2)
        .map(|name| name.trim_end_matches('/').to_string())
        .collect()
}

/// The room of a file, from its path under `src/`.
fn room_of(path: &Path) -> String {
    let parts: Vec<String> = path
        .components()
        .map(|c| {
            c.as_os_str()
                .to_string_lossy()
                .trim_end_matches(".rs")
                .to_string()
        })
        .collect();
    match parts.as_slice() {
        [doors, rest @ ..] if doors == "doors" => match rest {
            [only] if only == "mod" => "doors".into(),
            [door, ..] => format!("doors/{door}"),
            [] => "doors".into(),
        },
        [first, ..] => first.clone(),
        [] => unreachable!("a file has a name"),
    }
}

/// The rooms a file's text names through `crate::` paths (`use` lines, grouped or not, and
/// paths in code); comments and `pub(in crate::…)` visibilities name nothing.
fn named(text: &str) -> BTreeSet<String> {
    let code: String = text
        .lines()
        .map(|l| l.split("//").next().unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n")
        .replace("pub(in crate::", "pub(in ");
    let mut rooms = BTreeSet::new();
    let mut rest = code.as_str();
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        let paths: Vec<&str> = match rest.strip_prefix('{') {
            Some(group) => group
                .split('}')
                .next()
                .unwrap_or_default()
                .split(',')
                .collect(),
            None => vec![rest],
        };
        for path in paths {
            let segments: Vec<&str> = path
                .trim()
                .split("::")
                .map(|s| {
                    s.split(|c: char| !(c.is_alphanumeric() || c == '_'))
                        .next()
                        .unwrap_or_default()
                })
                .collect();
            match segments.as_slice() {
                ["doors", door, ..] if !door.is_empty() && *door != "self" => {
                    rooms.insert(format!("doors/{door}"));
                }
                [first, ..] if !first.is_empty() => {
                    rooms.insert(first.to_string());
                }
                _ => {}
            }
        }
    }
    rooms
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn every_import_of_the_gateway_is_one_its_rooms_line_allows() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let architecture = std::fs::read_to_string(root.join("../ARCHITECTURE.md")).unwrap();
    let rules = rules(&architecture);
    let src = root.join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let mut broken = Vec::new();
    for file in &files {
        let relative = file.strip_prefix(&src).unwrap();
        let room = room_of(relative);
        let Some(may) = rules.get(&room) else {
            broken.push(format!("{}: room `{room}` has no line", relative.display()));
            continue;
        };
        let text = std::fs::read_to_string(file).unwrap();
        for named in named(&text) {
            // The composition root (`lib`, `main`) and a room's own files name anything.
            if named == room || may.contains("*") || may.contains(&named) {
                continue;
            }
            broken.push(format!(
                "{} (room `{room}`) imports `{named}`",
                relative.display()
            ));
        }
    }
    assert!(
        broken.is_empty(),
        "imports against ARCHITECTURE.md's {HEADING:?}:\n{}",
        broken.join("\n")
    );
}

#[test]
fn the_reader_finds_the_rooms_a_text_names_and_the_table_its_lines() {
    let text = "use crate::doors::inbox::x;\nuse crate::{state::AppState, pages::layout, doors::mcp};\n\
                // crate::channels in a comment\npub(in crate::doors) fn f() { crate::time::now(); }\n";
    let expected: BTreeSet<String> = ["doors/inbox", "state", "pages", "doors/mcp", "time"]
        .into_iter()
        .map(String::from)
        .collect();
    assert_eq!(named(text), expected);
    assert_eq!(room_of(Path::new("doors/inbox/request.rs")), "doors/inbox");
    assert_eq!(room_of(Path::new("doors/email.rs")), "doors/email");
    assert_eq!(room_of(Path::new("doors/mod.rs")), "doors");
    assert_eq!(room_of(Path::new("live/streams.rs")), "live");
    let table = format!(
        "{HEADING}\n\ntext\n\n| room | holds | may import |\n|---|---|---|\n| `config`, `time` | x | {NOTHING} |\n| `pages/` | y | `state`, `decide` |\n\nafter\n"
    );
    let rules = rules(&table);
    assert_eq!(rules["config"], BTreeSet::new());
    assert_eq!(rules["time"], BTreeSet::new());
    assert_eq!(
        rules["pages"],
        ["decide", "state"].into_iter().map(String::from).collect()
    );
}

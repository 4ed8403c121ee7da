//! `#[derive(Settings)]`: a settings type names the environment variable that sets a field
//! beside that field, `#[env("NAME")]`, or `#[env("NAME", with = function)]` when the variable
//! has a form of its own (a function from its text to the TOML value the file would hold), and
//! `keep_empty` for one whose empty value must reach the field's checks rather than count as
//! unset (a token: one that failed to arrive must not open what it guards). The
//! derive gathers them into the type's `Settings::ENV` table, which the loader in
//! `countersign_runtime::config` reads; nothing else names a variable.

use proc_macro::TokenStream;
use quote::quote;
use syn::parse::ParseStream;
use syn::{Data, DeriveInput, Ident, LitStr, Path, Token, parse_macro_input};

/// Derives `Settings` for a struct: its `ENV` table from the `#[env(...)]` attributes of its
/// fields.
#[proc_macro_derive(Settings, attributes(env))]
pub fn derive_settings(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    env_table(&input)
        .unwrap_or_else(syn::Error::into_compile_error)
        .into()
}

fn env_table(input: &DeriveInput) -> syn::Result<proc_macro2::TokenStream> {
    let Data::Struct(data) = &input.data else {
        return Err(syn::Error::new_spanned(
            &input.ident,
            "Settings is derived for structs",
        ));
    };
    let mut vars = Vec::new();
    for field in &data.fields {
        for attr in field.attrs.iter().filter(|a| a.path().is_ident("env")) {
            let Some(key) = &field.ident else {
                return Err(syn::Error::new_spanned(attr, "#[env] needs a named field"));
            };
            let key = key.to_string();
            let EnvArgs {
                name,
                with,
                keep_empty,
            } = attr.parse_args_with(env_args)?;
            let parse = match with {
                Some(function) => quote!(::core::option::Option::Some(#function)),
                None => quote!(::core::option::Option::None),
            };
            vars.push(quote! {
                ::countersign_runtime::config::EnvVar {
                    name: #name, key: #key, parse: #parse, keep_empty: #keep_empty,
                }
            });
        }
    }
    let ident = &input.ident;
    let (impl_generics, ty_generics, where_clause) = input.generics.split_for_impl();
    Ok(quote! {
        impl #impl_generics ::countersign_runtime::config::Settings for #ident #ty_generics #where_clause {
            const ENV: &'static [::countersign_runtime::config::EnvVar] = &[#(#vars),*];
        }
    })
}

/// What `#[env(…)]` says.
struct EnvArgs {
    name: LitStr,
    with: Option<Path>,
    keep_empty: bool,
}

/// `"NAME"`, then optionally `with = function` and `keep_empty`, comma-separated.
fn env_args(input: ParseStream) -> syn::Result<EnvArgs> {
    let mut args = EnvArgs {
        name: input.parse()?,
        with: None,
        keep_empty: false,
    };
    while !input.is_empty() {
        input.parse::<Token![,]>()?;
        let word: Ident = input.parse()?;
        if word == "with" {
            input.parse::<Token![=]>()?;
            args.with = Some(input.parse()?);
        } else if word == "keep_empty" {
            args.keep_empty = true;
        } else {
            return Err(syn::Error::new(
                word.span(),
                "expected `with = function` or `keep_empty`",
            ));
        }
    }
    Ok(args)
}

//! `str_enum!`: closed sets of names (statuses, modes, classes) with one spelling shared by the
//! database, event payloads, the wire and the CLI.

/// Declares a fieldless enum whose variants each have one snake_case name, with `as_str`,
/// `Display`, `FromStr` (an `InvalidArgument` listing the accepted names), a `parse_stored`
/// that reports unknown stored names as `Corrupt`, and serde as that string.
macro_rules! str_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident ($what:literal) {
            $( $(#[$vmeta:meta])* $variant:ident => $text:literal ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name {
            $( $(#[$vmeta])* $variant ),+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [Self] = &[$(Self::$variant),+];

            /// The name stored in the database and written in event payloads.
            #[must_use]
            pub fn as_str(self) -> &'static str {
                match self {
                    $(Self::$variant => $text),+
                }
            }

            /// Parses a stored name; an unknown one means the data is corrupt.
            #[allow(dead_code, reason = "not every enum is read back from a column")]
            pub(crate) fn parse_stored(s: &str) -> $crate::error::Result<Self> {
                s.parse().map_err(|_| {
                    $crate::error::LedgerError::corrupt(format!(
                        concat!("unknown stored ", $what, " {:?}"),
                        s
                    ))
                })
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl std::str::FromStr for $name {
            type Err = $crate::error::LedgerError;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s {
                    $($text => Ok(Self::$variant),)+
                    other => Err($crate::error::LedgerError::invalid(format!(
                        concat!("unknown ", $what, " {:?}; expected one of: {}"),
                        other,
                        [$($text),+].join(", ")
                    ))),
                }
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
                text.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

pub(crate) use str_enum;

//! The root `Open_vSwitch` row.

use std::collections::BTreeMap;

use crate::datum::{Ref, Set, Uuid};

table! {
    /// The single root row: what references the bridges (a bridge it does not reference is
    /// garbage), and `other_config` (`flow-restore-wait`).
    OpenVswitch in "Open_vSwitch" {
        UUID uuid: Uuid = "_uuid",
        BRIDGES bridges: Set<Ref> = "bridges",
        OTHER_CONFIG other_config: BTreeMap<String, String> = "other_config",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rows::{fixtures, Table};

    #[test]
    fn parses_the_servers_row() {
        let r = OpenVswitch::from_rows(&fixtures::rows(fixtures::OPEN_VSWITCH)).unwrap().remove(0);
        assert_eq!(r.uuid().unwrap().as_str(), "d16a2ad8-05e7-4a31-b17b-f194a3b675bb");
        // One bridge: the bare uuid atom is a set of one.
        assert_eq!(r.bridges().unwrap().uuids().map(Uuid::as_str).collect::<Vec<_>>(), ["34753c2a-c5c3-4cce-94f2-f6100ffde424"]);
        assert_eq!(r.other_config().unwrap()["flow-restore-wait"], "true");
    }
}

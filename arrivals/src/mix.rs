//! The operation mix: which kind each request is.

/// Kind of one operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "camelCase"))]
pub enum OpKind {
    /// `find {_id: k}` limit 1.
    PointRead,
    /// `find {_id: {$gte: k, $lt: k + n}}`.
    RangeRead,
    /// `insert` of one new document.
    Insert,
    /// `update {_id: k} {$inc: {n: 1}}`.
    Update,
}

impl OpKind {
    /// All kinds, in mix order.
    pub const ALL: [OpKind; 4] = [
        OpKind::PointRead,
        OpKind::RangeRead,
        OpKind::Insert,
        OpKind::Update,
    ];

    /// Whether the kind reads (a read ticket; upstream 3.9.1 accepts `maxTimeMS` on it).
    pub fn is_read(self) -> bool {
        matches!(self, OpKind::PointRead | OpKind::RangeRead)
    }

    /// The command's name.
    pub fn command(self) -> &'static str {
        match self {
            OpKind::PointRead | OpKind::RangeRead => "find",
            OpKind::Insert => "insert",
            OpKind::Update => "update",
        }
    }
}

/// Relative weights of the operation kinds.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct OpMix {
    /// Point reads.
    pub point: f64,
    /// Range reads.
    pub range: f64,
    /// Inserts.
    pub insert: f64,
    /// Updates.
    pub update: f64,
    /// Documents per range read.
    pub range_len: i64,
}

impl Default for OpMix {
    fn default() -> Self {
        OpMix {
            point: 80.0,
            range: 10.0,
            insert: 5.0,
            update: 5.0,
            range_len: 20,
        }
    }
}

impl OpMix {
    /// Parses `point=80,range=10,insert=5,update=5` (missing kinds get 0).
    ///
    /// # Errors
    ///
    /// A message naming the entry that is not `KIND=WEIGHT` with a known kind and a weight of
    /// at least 0, or saying that no kind has a positive weight.
    pub fn parse(spec: &str) -> Result<OpMix, String> {
        let mut mix = OpMix {
            point: 0.0,
            range: 0.0,
            insert: 0.0,
            update: 0.0,
            range_len: OpMix::default().range_len,
        };
        for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| format!("mix entry {part:?}: expected KIND=WEIGHT"))?;
            let v: f64 = v
                .trim()
                .parse()
                .map_err(|_| format!("mix entry {part:?}: bad weight"))?;
            if !(v.is_finite() && v >= 0.0) {
                return Err(format!("mix entry {part:?}: weight must be >= 0"));
            }
            match k.trim() {
                "point" => mix.point = v,
                "range" => mix.range = v,
                "insert" => mix.insert = v,
                "update" => mix.update = v,
                other => return Err(format!("unknown operation kind {other:?}")),
            }
        }
        if mix.total() <= 0.0 {
            return Err("the mix has no operation with a positive weight".into());
        }
        Ok(mix)
    }

    fn total(&self) -> f64 {
        self.point + self.range + self.insert + self.update
    }

    /// Weight of `kind` as a fraction of the whole mix.
    pub fn share(&self, kind: OpKind) -> f64 {
        let w = match kind {
            OpKind::PointRead => self.point,
            OpKind::RangeRead => self.range,
            OpKind::Insert => self.insert,
            OpKind::Update => self.update,
        };
        w / self.total()
    }

    /// Picks a kind from a uniform number in [0, 1).
    pub fn pick(&self, u: f64) -> OpKind {
        let mut acc = 0.0;
        for k in OpKind::ALL {
            acc += self.share(k);
            if u < acc {
                return k;
            }
        }
        OpKind::PointRead
    }
}

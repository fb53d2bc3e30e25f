"""Small, realistic, deterministic SQLite databases that ship with the project as code.

They serve the scorer demo, the tests and the nano training demo (which splits them by database into
train, validation and test: `HELD_OUT_SETS`). Each has foreign keys, a few hundred to a few thousand rows,
text, integer, real and date columns, NULLs and duplicate values -- enough for joins, aggregates and filters
to mean something. `build_demo_dbs(out_dir)` writes `<out_dir>/<db_id>/<db_id>.sqlite`; the same seed gives
byte-identical files.
"""

from __future__ import annotations

import os
import random
import sqlite3
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

FIRST = ["Ana", "Ben", "Chen", "Dana", "Eli", "Fatima", "Gus", "Hana", "Ivan", "Jia", "Kofi", "Lena", "Mateo",
         "Nora", "Omar", "Priya", "Quinn", "Rosa", "Sven", "Tara", "Uma", "Victor", "Wen", "Yara", "Zoe"]
LAST = ["Garcia", "Smith", "Wang", "Okafor", "Muller", "Rossi", "Kim", "Novak", "Silva", "Haddad", "Tanaka",
        "Ivanova", "Brown", "Lopez", "Dubois", "Nguyen"]
CITIES = ["Lisbon", "Madrid", "Paris", "Berlin", "Rome", "Vienna", "Prague", "Oslo", "Dublin", "Athens"]
COUNTRY = {"Lisbon": "Portugal", "Madrid": "Spain", "Paris": "France", "Berlin": "Germany", "Rome": "Italy",
           "Vienna": "Austria", "Prague": "Czechia", "Oslo": "Norway", "Dublin": "Ireland", "Athens": "Greece"}

Gen = Callable[[random.Random, int], object]


def _name(rng: random.Random, _i: int) -> str:
    return f"{rng.choice(FIRST)} {rng.choice(LAST)}"


def _date(lo: int, hi: int) -> Gen:
    return lambda rng, _i: f"{rng.randint(lo, hi)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"


def _fk(n: int) -> Gen:
    return lambda rng, _i: rng.randint(1, n)


def _maybe_null(gen: Gen, p: float) -> Gen:
    return lambda rng, i: None if rng.random() < p else gen(rng, i)


def _pick(options) -> Gen:
    return lambda rng, _i: rng.choice(options)


def _int(lo: int, hi: int) -> Gen:
    return lambda rng, _i: rng.randint(lo, hi)


def _real(lo: float, hi: float, nd: int = 2) -> Gen:
    return lambda rng, _i: round(rng.uniform(lo, hi), nd)


def _indexed(fmt: str, options) -> Gen:
    return lambda rng, i: fmt.format(rng.choice(options), i)


# db_id -> list of (table, n_rows, [(column, sql_type, generator, references or None)])
# The first column of every table is an INTEGER PRIMARY KEY filled with 1..n_rows.
SCHEMAS: dict[str, list[tuple[str, int, list[tuple[str, str, Gen, str | None]]]]] = {
    "retail": [
        ("customers", 400, [("name", "TEXT", _name, None), ("city", "TEXT", _pick(CITIES), None),
                            ("signup_year", "INTEGER", _int(2015, 2024), None),
                            ("email", "TEXT", _maybe_null(_indexed("{}{}@mail.com", ["ana", "ben", "kim"]), 0.1),
                             None)]),
        ("products", 120, [("name", "TEXT", _indexed("{} {}", ["Lamp", "Chair", "Desk", "Mug", "Pen", "Bag"]), None),
                           ("category", "TEXT", _pick(["home", "office", "kitchen", "travel"]), None),
                           ("price", "REAL", _real(2, 400), None),
                           ("stock", "INTEGER", _int(0, 500), None)]),
        ("orders", 1500, [("customer_id", "INTEGER", _fk(400), "customers"),
                          ("order_date", "TEXT", _date(2019, 2024), None),
                          ("status", "TEXT", _pick(["shipped", "shipped", "delivered", "cancelled", "pending"]),
                           None)]),
        ("order_items", 3000, [("order_id", "INTEGER", _fk(1500), "orders"),
                               ("product_id", "INTEGER", _fk(120), "products"),
                               ("quantity", "INTEGER", _int(1, 6), None),
                               ("unit_price", "REAL", _real(2, 400), None)]),
    ],
    "university": [
        ("departments", 12, [("name", "TEXT", _indexed("{} {}", ["Physics", "History", "Biology", "Law"]), None),
                             ("building", "TEXT", _pick(["North Hall", "South Hall", "Main", "Annex"]), None),
                             ("budget", "REAL", _real(1e5, 2e6, 0), None)]),
        ("instructors", 90, [("name", "TEXT", _name, None), ("department_id", "INTEGER", _fk(12), "departments"),
                             ("salary", "REAL", _real(40000, 160000, 0), None),
                             ("hire_year", "INTEGER", _int(1990, 2024), None)]),
        ("students", 800, [("name", "TEXT", _name, None), ("department_id", "INTEGER", _fk(12), "departments"),
                           ("enrollment_year", "INTEGER", _int(2016, 2024), None),
                           ("gpa", "REAL", _maybe_null(_real(1.5, 4.0), 0.05), None)]),
        ("courses", 150, [("title", "TEXT", _indexed("{} {}", ["Intro to", "Advanced", "Topics in", "Seminar"]),
                           None),
                          ("department_id", "INTEGER", _fk(12), "departments"),
                          ("instructor_id", "INTEGER", _fk(90), "instructors"),
                          ("credits", "INTEGER", _pick([2, 3, 3, 4, 6]), None)]),
        ("enrollments", 2500, [("student_id", "INTEGER", _fk(800), "students"),
                               ("course_id", "INTEGER", _fk(150), "courses"),
                               ("semester", "TEXT", _pick(["Fall 2023", "Spring 2024", "Fall 2024"]), None),
                               ("grade", "TEXT", _maybe_null(_pick(["A", "B", "C", "D", "F"]), 0.1), None)]),
    ],
    "library": [
        ("authors", 150, [("name", "TEXT", _name, None), ("nationality", "TEXT", _pick(list(COUNTRY.values())), None),
                          ("birth_year", "INTEGER", _int(1900, 1995), None)]),
        ("books", 700, [("title", "TEXT", _indexed("The {} {}", ["River", "Garden", "Winter", "Map", "Letter"]), None),
                        ("author_id", "INTEGER", _fk(150), "authors"),
                        ("genre", "TEXT", _pick(["novel", "poetry", "history", "science", "mystery"]), None),
                        ("publish_year", "INTEGER", _int(1950, 2024), None),
                        ("pages", "INTEGER", _int(80, 900), None)]),
        ("members", 500, [("name", "TEXT", _name, None), ("city", "TEXT", _pick(CITIES), None),
                          ("join_year", "INTEGER", _int(2010, 2024), None)]),
        ("loans", 2500, [("book_id", "INTEGER", _fk(700), "books"), ("member_id", "INTEGER", _fk(500), "members"),
                         ("loan_date", "TEXT", _date(2020, 2024), None),
                         ("returned", "INTEGER", _pick([0, 1, 1, 1]), None)]),
    ],
    "clinic": [
        ("doctors", 60, [("name", "TEXT", _name, None),
                         ("specialty", "TEXT", _pick(["cardiology", "pediatrics", "dermatology", "neurology"]), None),
                         ("years_experience", "INTEGER", _int(1, 40), None)]),
        ("patients", 900, [("name", "TEXT", _name, None), ("age", "INTEGER", _int(1, 95), None),
                           ("gender", "TEXT", _pick(["F", "M"]), None), ("city", "TEXT", _pick(CITIES), None)]),
        ("appointments", 3000, [("doctor_id", "INTEGER", _fk(60), "doctors"),
                                ("patient_id", "INTEGER", _fk(900), "patients"),
                                ("appointment_date", "TEXT", _date(2021, 2024), None),
                                ("fee", "REAL", _real(30, 300), None),
                                ("status", "TEXT", _pick(["completed", "completed", "cancelled", "no-show"]), None)]),
    ],
    "flights": [
        ("airlines", 15, [("name", "TEXT", _indexed("{} Air {}", ["Blue", "Sun", "North", "Euro"]), None),
                          ("country", "TEXT", _pick(list(COUNTRY.values())), None)]),
        ("airports", 40, [("city", "TEXT", _pick(CITIES), None),
                          ("code", "TEXT", lambda rng, i: "".join(rng.choice("ABCDEFGHKLMNPRSTVZ") for _ in range(3)),
                           None),
                          ("elevation", "INTEGER", _int(0, 2500), None)]),
        ("flights", 2500, [("airline_id", "INTEGER", _fk(15), "airlines"),
                           ("source_airport_id", "INTEGER", _fk(40), "airports"),
                           ("dest_airport_id", "INTEGER", _fk(40), "airports"),
                           ("departure_date", "TEXT", _date(2022, 2024), None),
                           ("distance", "INTEGER", _int(150, 4000), None),
                           ("price", "REAL", _real(30, 900), None)]),
    ],
}

DEMO_DB_IDS = tuple(SCHEMAS)

# Entities for procedurally generated databases: (table, singular, columns). Many schemas, few rows
# each: a small model trained on three fixed schemas memorises their names; trained on dozens it has to
# read the schema and the question -- which is what transfers to held-out databases. The held-out demo
# databases' tables (doctors, patients, appointments, airlines, airports, flights) are kept out of here.
_LEVELS = ["low", "medium", "high"]
ENTITIES: list[tuple[str, str, list[tuple[str, str, Gen]]]] = [
    ("employees", "employee", [("name", "TEXT", _name), ("department", "TEXT", _pick(["sales", "it", "hr", "ops"])),
                               ("salary", "REAL", _real(20000, 120000, 0)), ("hire_year", "INTEGER", _int(2000, 2024))]),
    ("projects", "project", [("title", "TEXT", _indexed("{} {}", ["Apollo", "Nova", "Orion"])),
                             ("budget", "REAL", _real(1000, 90000, 0)), ("status", "TEXT", _pick(["open", "closed"]))]),
    ("ships", "ship", [("name", "TEXT", _indexed("{} {}", ["Sea", "Star", "Wave"])), ("tonnage", "INTEGER", _int(500, 90000)),
                       ("flag", "TEXT", _pick(list(COUNTRY.values()))), ("built_year", "INTEGER", _int(1960, 2023))]),
    ("planets", "planet", [("name", "TEXT", _indexed("{}-{}", ["Kepler", "Gliese", "Tau"])),
                           ("mass", "REAL", _real(0.1, 30)), ("moons", "INTEGER", _int(0, 80))]),
    ("recipes", "recipe", [("title", "TEXT", _indexed("{} {}", ["Soup", "Pie", "Salad"])),
                           ("cuisine", "TEXT", _pick(["thai", "greek", "mexican", "french"])),
                           ("calories", "INTEGER", _int(80, 1500)), ("prep_minutes", "INTEGER", _int(5, 240))]),
    ("songs", "song", [("title", "TEXT", _indexed("{} {}", ["Blue", "Night", "Fire"])), ("genre", "TEXT", _pick(["rock", "jazz", "pop"])),
                       ("duration", "INTEGER", _int(90, 600)), ("release_year", "INTEGER", _int(1960, 2024))]),
    ("artists", "artist", [("name", "TEXT", _name), ("country", "TEXT", _pick(list(COUNTRY.values()))),
                           ("debut_year", "INTEGER", _int(1950, 2020))]),
    ("teams", "team", [("name", "TEXT", _indexed("{} {}", ["Lions", "Hawks", "Bears"])), ("city", "TEXT", _pick(CITIES)),
                       ("founded", "INTEGER", _int(1880, 2010))]),
    ("players", "player", [("name", "TEXT", _name), ("position", "TEXT", _pick(["guard", "forward", "center"])),
                           ("age", "INTEGER", _int(17, 40)), ("goals", "INTEGER", _int(0, 60))]),
    ("hotels", "hotel", [("name", "TEXT", _indexed("Hotel {} {}", ["Royal", "Park", "Grand"])), ("city", "TEXT", _pick(CITIES)),
                         ("stars", "INTEGER", _int(1, 5)), ("rooms", "INTEGER", _int(10, 400))]),
    ("guests", "guest", [("name", "TEXT", _name), ("nationality", "TEXT", _pick(list(COUNTRY.values()))),
                         ("age", "INTEGER", _int(18, 90))]),
    ("cars", "car", [("model", "TEXT", _indexed("{} {}", ["Falcon", "Comet", "Vega"])), ("color", "TEXT", _pick(["red", "black", "white", "blue"])),
                     ("price", "REAL", _real(5000, 90000, 0)), ("year", "INTEGER", _int(1995, 2024))]),
    ("dealers", "dealer", [("name", "TEXT", _name), ("city", "TEXT", _pick(CITIES)), ("rating", "REAL", _real(1, 5, 1))]),
    ("movies", "movie", [("title", "TEXT", _indexed("The {} {}", ["Last", "Silent", "Red"])),
                         ("genre", "TEXT", _pick(["drama", "comedy", "horror", "action"])),
                         ("runtime", "INTEGER", _int(70, 200)), ("gross", "REAL", _real(0.1, 900, 1))]),
    ("studios", "studio", [("name", "TEXT", _indexed("{} Pictures {}", ["North", "Sun", "Iron"])),
                           ("country", "TEXT", _pick(list(COUNTRY.values())))]),
    ("restaurants", "restaurant", [("name", "TEXT", _indexed("{} {}", ["Chez", "Casa", "Villa"])), ("city", "TEXT", _pick(CITIES)),
                                   ("rating", "REAL", _real(1, 5, 1)), ("seats", "INTEGER", _int(10, 200))]),
    ("dishes", "dish", [("name", "TEXT", _indexed("{} {}", ["Risotto", "Curry", "Tacos"])), ("price", "REAL", _real(4, 60)),
                        ("spicy", "INTEGER", _pick([0, 1]))]),
    ("museums", "museum", [("name", "TEXT", _indexed("{} Museum {}", ["City", "Modern", "Naval"])), ("city", "TEXT", _pick(CITIES)),
                           ("visitors", "INTEGER", _int(1000, 900000))]),
    ("paintings", "painting", [("title", "TEXT", _indexed("{} {}", ["Sunrise", "Portrait", "Harbor"])),
                               ("style", "TEXT", _pick(["baroque", "cubist", "modern"])), ("year", "INTEGER", _int(1500, 2020)),
                               ("value", "REAL", _real(1000, 5e6, 0))]),
    ("stores", "store", [("name", "TEXT", _indexed("{} {}", ["Market", "Corner", "Depot"])), ("city", "TEXT", _pick(CITIES)),
                         ("size", "TEXT", _pick(_LEVELS))]),
    ("suppliers", "supplier", [("name", "TEXT", _name), ("country", "TEXT", _pick(list(COUNTRY.values()))),
                               ("reliability", "TEXT", _pick(_LEVELS))]),
    ("parks", "park", [("name", "TEXT", _indexed("{} Park {}", ["Oak", "River", "Hill"])), ("area", "REAL", _real(1, 900)),
                       ("city", "TEXT", _pick(CITIES))]),
    ("events", "event", [("name", "TEXT", _indexed("{} {}", ["Festival", "Fair", "Race"])), ("event_date", "TEXT", _date(2018, 2024)),
                         ("attendance", "INTEGER", _int(50, 50000)), ("category", "TEXT", _pick(["music", "sport", "food"]))]),
    ("vehicles", "vehicle", [("plate", "TEXT", _indexed("{}-{}", ["AB", "KL", "ZX"])), ("kind", "TEXT", _pick(["bus", "tram", "van"])),
                             ("capacity", "INTEGER", _int(2, 120))]),
]


# Entities for held-out databases whose table names, column names and text values come from a part of the
# vocabulary no training database uses (no word of a name or of a text value is shared with ENTITIES or the
# hand-written schemas, the `id` key and the `_id` of a foreign key aside; `tests/test_nano_holdout.py` checks
# the built databases). The validation and test parts share no word either, so a choice made on the one is
# not fitted to the names of the other. Each entity keeps the shape of a training one: a label, a category,
# one or two numbers.
UNSEEN_VALIDATION_ENTITIES: list[tuple[str, str, list[tuple[str, str, Gen]]]] = [
    ("geysers", "geyser", [("designation", "TEXT", _indexed("Geyser {} {}", ["Ember", "Ash", "Cinder"])),
                           ("activity", "TEXT", _pick(["dormant", "erupting", "extinct"])),
                           ("plume_metres", "INTEGER", _int(2, 90)), ("eruptions", "INTEGER", _int(0, 400))]),
    ("glaciers", "glacier", [("moniker", "TEXT", _indexed("{} Ice {}", ["Frost", "Polar", "Boreal"])),
                             ("thickness", "REAL", _real(10, 900)), ("retreat_rate", "REAL", _real(0.1, 40)),
                             ("surveyed", "INTEGER", _int(1950, 2024))]),
    ("orchards", "orchard", [("estate", "TEXT", _indexed("{} Grove {}", ["Amber", "Cedar", "Willow"])),
                             ("fruit", "TEXT", _pick(["apple", "pear", "plum", "cherry"])),
                             ("hectares", "REAL", _real(1, 300)), ("trees", "INTEGER", _int(50, 9000))]),
    ("lighthouses", "lighthouse", [("beacon", "TEXT", _indexed("{} Light {}", ["Cape", "Reef", "Point"])),
                                   ("coastline", "TEXT", _pick(["rocky", "sandy", "cliff"])),
                                   ("range_km", "INTEGER", _int(5, 60)), ("lit_since", "INTEGER", _int(1700, 1990))]),
    ("beehives", "beehive", [("apiary", "TEXT", _indexed("Apiary {} {}", ["Clover", "Heather", "Thyme"])),
                             ("breed", "TEXT", _pick(["carniolan", "italian", "buckfast"])),
                             ("honey_kg", "REAL", _real(2, 80)), ("frames", "INTEGER", _int(5, 30))]),
    ("telescopes", "telescope", [("callsign", "TEXT", _indexed("{}-{}", ["Lyra", "Draco", "Cygnus"])),
                                 ("mounting", "TEXT", _pick(["equatorial", "altazimuth", "dobsonian"])),
                                 ("aperture_mm", "INTEGER", _int(50, 1000)), ("focal_ratio", "REAL", _real(2, 15))]),
    ("vineyards", "vineyard", [("domaine", "TEXT", _indexed("Domaine {} {}", ["Clos", "Mas", "Rive"])),
                               ("grape", "TEXT", _pick(["merlot", "syrah", "riesling"])),
                               ("vines", "INTEGER", _int(500, 90000)), ("harvest_tonnes", "REAL", _real(1, 500))]),
    ("caves", "cave", [("cavern", "TEXT", _indexed("{} Cavern {}", ["Crystal", "Echo", "Shadow"])),
                       ("rock", "TEXT", _pick(["limestone", "basalt", "gypsum"])),
                       ("depth_m", "INTEGER", _int(5, 2000)), ("chambers", "INTEGER", _int(1, 60))]),
    ("satellites", "satellite", [("codename", "TEXT", _indexed("{}-{}", ["Vesta", "Juno", "Ceres"])),
                                 ("orbit", "TEXT", _pick(["leo", "meo", "geo"])),
                                 ("payload_kg", "INTEGER", _int(10, 6000)),
                                 ("altitude_km", "INTEGER", _int(200, 36000))]),
    ("bridges", "bridge", [("crossing", "TEXT", _indexed("{} Crossing {}", ["Granite", "Copper", "Slate"])),
                           ("design", "TEXT", _pick(["suspension", "arch", "truss"])),
                           ("span_m", "INTEGER", _int(20, 2000)), ("opened", "INTEGER", _int(1850, 2023))]),
]
UNSEEN_TEST_ENTITIES: list[tuple[str, str, list[tuple[str, str, Gen]]]] = [
    ("submarines", "submarine", [("hull_code", "TEXT", _indexed("{}-{}", ["SSK", "SSN", "SSB"])),
                                 ("propulsion", "TEXT", _pick(["diesel", "nuclear", "electric"])),
                                 ("crew", "INTEGER", _int(20, 150)), ("displacement", "INTEGER", _int(500, 20000))]),
    ("castles", "castle", [("fortress", "TEXT", _indexed("Castle {} {}", ["Dragon", "Raven", "Thorn"])),
                           ("architecture", "TEXT", _pick(["norman", "gothic", "moorish"])),
                           ("towers", "INTEGER", _int(1, 30)), ("sieges", "INTEGER", _int(0, 20))]),
    ("windmills", "windmill", [("mill", "TEXT", _indexed("{} Mill {}", ["Zephyr", "Gale", "Breeze"])),
                               ("grinds", "TEXT", _pick(["grain", "pepper", "linseed"])),
                               ("sails", "INTEGER", _int(4, 8)), ("erected", "INTEGER", _int(1600, 1950))]),
    ("reptiles", "reptile", [("specimen", "TEXT", _indexed("{} {}", ["Gecko", "Iguana", "Skink"])),
                             ("habitat", "TEXT", _pick(["desert", "jungle", "swamp"])),
                             ("length_cm", "REAL", _real(5, 600)), ("lifespan", "INTEGER", _int(2, 150))]),
    ("fossils", "fossil", [("catalogue", "TEXT", _indexed("Fossil {} {}", ["Trilobite", "Ammonite", "Raptor"])),
                           ("era", "TEXT", _pick(["jurassic", "triassic", "cretaceous"])),
                           ("weight_g", "REAL", _real(1, 90000)), ("excavated", "INTEGER", _int(1850, 2024))]),
    ("canals", "canal", [("waterway", "TEXT", _indexed("{} Canal {}", ["Heron", "Otter", "Kingfisher"])),
                         ("locks", "INTEGER", _int(0, 80)), ("width", "REAL", _real(3, 50)),
                         ("navigable", "INTEGER", _pick([0, 1]))]),
    ("quarries", "quarry", [("pit", "TEXT", _indexed("{} Pit {}", ["Marble", "Flint", "Chalk"])),
                            ("mineral", "TEXT", _pick(["sandstone", "dolomite", "shale"])),
                            ("annual_output", "INTEGER", _int(1000, 900000)), ("workers", "INTEGER", _int(3, 400))]),
    ("tapestries", "tapestry", [("motif", "TEXT", _indexed("{} {}", ["Unicorn", "Griffin", "Stag"])),
                                ("weave", "TEXT", _pick(["wool", "silk", "linen"])),
                                ("woven", "INTEGER", _int(1300, 1900)), ("knots", "INTEGER", _int(1000, 900000))]),
    ("pharmacies", "pharmacy", [("dispensary", "TEXT", _indexed("{} Chemist {}", ["Elm", "Birch", "Maple"])),
                                ("district", "TEXT", _pick(["uptown", "harbourside", "suburb"])),
                                ("prescriptions", "INTEGER", _int(100, 90000)),
                                ("pharmacists", "INTEGER", _int(1, 12))]),
    ("aquariums", "aquarium", [("tank", "TEXT", _indexed("Tank {} {}", ["Coral", "Kelp", "Lagoon"])),
                               ("biome", "TEXT", _pick(["shoal", "estuary", "abyss"])),
                               ("salinity", "REAL", _real(0, 40)), ("fish", "INTEGER", _int(5, 900))]),
]

class HeldOutSet(NamedTuple):
    split: str  # validation: for every design choice | test: touched only to report
    prefix: str  # its databases are <prefix>_00, <prefix>_01, ...
    entities: list  # the vocabulary they are drawn from
    question_seed: int  # its questions are synthesized at the run's seed + this


# The held-out sets of generated databases. `*-seen-types`: new databases (rows and values) built from the
# training databases' table types; `*-unseen-names`: table and column names and text values no training database
# has. `val-seen-types` is the held-out set every earlier design was chosen on (`gen_eval_*`, questions at
# seed + 10000); the test sets' database ids and question seed were never used before they were drawn.
HELD_OUT_SETS: dict[str, HeldOutSet] = {
    "val-seen-types": HeldOutSet("validation", "gen_eval", ENTITIES, 10_000),
    "val-unseen-names": HeldOutSet("validation", "unseen_val", UNSEEN_VALIDATION_ENTITIES, 10_000),
    "test-seen-types": HeldOutSet("test", "gen_test", ENTITIES, 30_000),
    "test-unseen-names": HeldOutSet("test", "unseen_test", UNSEEN_TEST_ENTITIES, 30_000),
}


def held_out_db_ids(name: str, n: int) -> list[str]:
    """The `n` generated databases of held-out set `name` (a key of HELD_OUT_SETS)."""
    return [f"{HELD_OUT_SETS[name].prefix}_{i:02d}" for i in range(n)]


def _entities_for(db_id: str) -> list:
    """The entity vocabulary a generated database draws from: its held-out set's, else the training one."""
    for held_out in HELD_OUT_SETS.values():
        if db_id.startswith(held_out.prefix + "_"):
            return held_out.entities
    return ENTITIES


def random_schema(db_id: str, seed: int = 0) -> list:
    """A 3-table schema drawn from its vocabulary's entities (`_entities_for`), in `SCHEMAS` format: the 2nd and
    3rd tables reference earlier ones."""
    rng = random.Random(f"schema:{db_id}:{seed}")
    picked = rng.sample(_entities_for(db_id), 3)
    sizes = [rng.randint(40, 200), rng.randint(100, 400), rng.randint(200, 900)]
    tables = []
    for k, ((table, _singular, columns), n) in enumerate(zip(picked, sizes)):
        cols = list(columns)
        if k:
            j = rng.randrange(k)
            ref_table, ref_singular = picked[j][0], picked[j][1]
            cols.insert(rng.randint(0, len(cols)), (f"{ref_singular}_id", "INTEGER", _fk(sizes[j]), ref_table))
        tables.append((table, n, [c if len(c) == 4 else (*c, None) for c in cols]))
    return tables


def _create_sql(table: str, columns) -> str:
    parts = ["id INTEGER PRIMARY KEY"] + [f"{name} {sql_type}" for name, sql_type, _, _ in columns]
    parts += [f"FOREIGN KEY ({name}) REFERENCES {ref}(id)" for name, _, _, ref in columns if ref]
    return f"CREATE TABLE {table} (\n  " + ",\n  ".join(parts) + "\n)"


def build_demo_db(db_id: str, path: Path, seed: int = 0) -> Path:
    """Write one demo database to `path` (replacing it); ids not in SCHEMAS get a `random_schema`."""
    rng = random.Random(f"{db_id}:{seed}")
    tables = SCHEMAS[db_id] if db_id in SCHEMAS else random_schema(db_id, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    # A temp file of this call's own: runs started together on one db_root build the same databases at once,
    # and each must write its own copy (the same bytes, by the seed) before the atomic rename.
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(name)
    try:
        conn = sqlite3.connect(tmp)
        try:
            for table, n_rows, columns in tables:
                conn.execute(_create_sql(table, columns))
                rows = [(i, *(gen(rng, i) for _, _, gen, _ in columns)) for i in range(1, n_rows + 1)]
                conn.executemany(f"INSERT INTO {table} VALUES ({', '.join('?' * (len(columns) + 1))})", rows)
            conn.commit()
        finally:
            conn.close()
        tmp.replace(path)  # atomic: a crash never leaves a half-written database under its real name
    finally:
        tmp.unlink(missing_ok=True)
    return path


def build_demo_dbs(out_dir: str | Path, db_ids=DEMO_DB_IDS, seed: int = 0) -> list[Path]:
    """Write every demo database under `out_dir` (skipping ones already there); returns their paths."""
    out = Path(out_dir)
    paths = []
    for db_id in db_ids:
        path = out / db_id / f"{db_id}.sqlite"
        if not path.is_file():
            build_demo_db(db_id, path, seed)
        paths.append(path)
    return paths

"""More ways to say what toyworld can draw: the parser's own lexicon, beside the words a world config lists.

A weak text encoder still maps many phrasings onto the few things it can draw ("in a kitchen", "in a bedroom" ->
an indoor background; "at sunset", "in golden hour light" -> dusk). These entries are keyed by the renderer's
attribute values, so they apply to every world that has the value (random worlds share the default vocabulary) and
never depend on which bugs a world plants. Multi-word entries win over their words ("snowy field" is snow, not
grass), as the parser matches the longest phrase first. Anything not listed here or in the world config stays
unrendered.
"""

from __future__ import annotations

SYNONYMS: dict[str, dict[str, tuple[str, ...]]] = {
    "background": {
        "grass": ("grassland", "lawns", "meadows", "fields", "park", "garden", "pasture", "farm", "countryside",
                  "prairie", "savanna", "field of wheat", "wheat field"),
        "sand": ("sand dunes", "dunes", "dune", "seaside", "coast", "shore", "sandy shore", "sandstorm"),
        "snow": ("snowy field", "snowy meadow", "snowfield", "snowstorm", "blizzard", "snowfall", "frozen lake",
                 "glacier", "frost", "frosty", "icy"),
        "water": ("underwater", "swamp", "marsh", "pool", "swimming pool", "aquarium", "fish tank", "stream",
                  "waves", "lakes", "rivers", "seabed", "waterfall", "harbour", "harbor", "boat"),
        "road": ("streets", "roads", "city", "city street", "town", "sidewalk", "pavements", "parking lot",
                 "car park", "highway", "motorway", "crosswalk", "alley"),
        "indoor": ("kitchen", "living room", "bedroom", "bathroom", "office", "classroom", "library", "shop",
                   "store", "garage", "hallway", "corridor", "carpet", "rug", "apartment", "home", "rooms",
                   "cluttered room", "laboratory", "lab"),
        "forest": ("tree", "woodland", "rainforest", "jungles", "forests", "pine forest", "thicket"),
        "sky": ("midair", "mid air", "cloud", "skies", "sky background"),
        "rock": ("mountains", "mountain top", "mountainside", "rocky shore", "cave", "boulder", "boulders",
                 "cliffs", "canyon", "quarry", "gravel", "pebbles"),
    },
    "lighting": {
        "day": ("sunshine", "sunlit", "bright sunlight", "midday", "noon", "broad daylight"),
        "dusk": ("dawn", "sunrise", "golden hour", "golden hour light", "late afternoon", "nightfall", "sundown",
                 "daybreak"),
        "night": ("in the dark", "darkness", "full moon", "moon", "moonlit", "midnight", "streetlights",
                  "street lights", "neon lights", "neon", "candlelight", "dim light", "dim", "low light",
                  "underexposed"),
        "fog": ("mists", "hazy", "smoke", "smoky", "fog bank", "murky"),
    },
    "domain": {
        "photo": ("photographs", "photos", "snapshot", "photography", "polaroid"),
        "sketch": ("drawn", "draw", "child drawing", "children drawing", "line drawing", "line art",
                   "charcoal drawing", "ink drawing", "doodle",
                   "engraving", "etching", "woodcut", "graphite", "crayon drawing", "outline"),
        "painting": ("paint", "paintings", "oil paint", "acrylic", "gouache", "watercolours", "watercolors",
                     "artwork", "canvas", "illustration", "cartoon"),
    },
    "co_object": {
        "flower": ("bloom", "blooms", "daisy", "daisies", "rose", "roses", "tulip", "tulips", "sunflower",
                   "flowerbed", "flower bed", "bouquet", "petal", "potted plant", "blossoms"),
        "net": ("fishing nets", "netting", "landing net", "trawl net", "mesh bag"),
        "person": ("boy", "girl", "kid", "kids", "children", "men", "women", "someone", "crowd", "family",
                   "hiker", "fisherman", "farmer", "gardener", "persons"),
        "ball": ("balls", "football", "soccer ball", "tennis ball", "basketball", "beach ball", "toys",
                 "plaything"),
    },
    "colour": {
        "orange": ("amber", "tangerine", "rust"),
        "grey": ("greyish", "grayish", "slate"),
        "black": ("ebony", "blackish", "jet"),
        "white": ("ivory", "cream", "creamy", "pale"),
        "brown": ("chocolate", "chestnut", "beige", "caramel"),
        "yellow": ("gold", "lemon", "mustard"),
        "red": ("crimson", "scarlet", "maroon"),
        "blue": ("navy", "azure", "turquoise"),
        "green": ("olive", "lime", "emerald"),
        "purple": ("lilac", "lavender", "mauve", "magenta"),
    },
}
"""Extra phrases per attribute value, by attribute. Colours are single words ('colour' also serves co-occurring
objects' colours): the parser reads a colour word by word, next to what it describes."""

"""Word lists the world generator draws app content from (songs, messages, payments, files)."""

from __future__ import annotations

GENRES = ("pop", "rock", "jazz", "hip hop", "electronic", "folk", "classical", "r&b")

ARTISTS = (
    "The Paper Lanterns", "Mira Vale", "Golden Hour Club", "Oslo Static", "Ruby Tamarind",
    "The Night Ferries", "Kofi Mensah Trio", "Luna Park", "Velvet Cartography", "Sam Okoro",
    "The Quiet Engines", "Iris Calloway", "Northern Static", "Dune Market", "Casper Lind",
    "Harbor Lights", "Pale Meridian", "June Okafor",
)  # fmt: skip

SONG_WORDS = """
Midnight Paper Silver River Golden Static Quiet Neon Summer Winter Lantern Ocean Echo Velvet
Harbor Electric Falling Broken Wild Hollow Northern Crimson Distant Paper Glass Morning
Tender Restless Satellite Wandering Burning Secret Lonely Bright Faded
""".split()  # noqa: SIM905 - a word list reads best as words

SONG_NOUNS = """
Heart Lights Roads Dreams Skies Letters Waves Hours Cities Fires Shadows Gardens Signals
Mirrors Horizons Tides Rooms Streets Bridges Stars Trains Voices Windows Seasons
""".split()  # noqa: SIM905 - a word list reads best as words

TEXT_BODIES = (
    "Are we still on for {day}?",
    "Running 10 minutes late, sorry!",
    "Did you see the game last night?",
    "Can you send me that recipe?",
    "Happy to help with the move on {day}.",
    "Thanks again for dinner!",
    "Call me when you get a chance.",
    "I left my charger at your place.",
    "Let's grab coffee {day}.",
    "Good luck with the presentation!",
)

DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")

PAYMENT_DESCRIPTIONS = (
    "pizza night",
    "groceries",
    "concert tickets",
    "utilities",
    "taxi",
    "birthday gift",
    "brunch",
    "movie tickets",
    "gas money",
    "coffee",
    "book club snacks",
    "internet bill",
    "board game",
    "plant for the balcony",
)

EMAIL_TOPICS = (
    ("Weekend plans", "Do you want to go hiking on Saturday? The weather looks great."),
    ("Quarterly report", "Please review the attached numbers before Thursday's meeting."),
    ("Dinner recipe", "Here is the recipe I promised you. The secret is fresh basil."),
    ("Team offsite", "We are planning an offsite next month; send your availability."),
    ("Photos from the trip", "I finally sorted the photos from our trip; they are attached."),
    ("Book recommendation", "You have to read The Glass Harbor, it's wonderful."),
    ("Project kickoff", "Kickoff is on Monday at 10am in the big conference room."),
    ("Invoice", "Attached is the invoice for last month. Thanks for your business."),
    ("Garden tips", "Water the tomatoes in the morning and never in full sun."),
    ("Reunion", "The family reunion is set for July. Can you bring dessert?"),
)

FILE_TEMPLATES = (
    ("/documents/recipes/pancakes.txt", "2 eggs\n1 cup flour\n1 cup milk\n1 tbsp sugar"),
    ("/documents/packing_list.txt", "passport\ncharger\nsunscreen\nhiking boots"),
    ("/documents/reading_list.txt", "The Glass Harbor\nNorthern Static\nA Paper Lantern"),
    ("/work/meeting_notes.txt", "Discussed roadmap. Follow up on hiring plan."),
    ("/work/ideas.txt", "Dark mode\nOffline sync\nShared playlists"),
    ("/photos/README.txt", "Holiday photos, sorted by year."),
    ("/documents/budget.txt", "rent 1200\nfood 400\ntransport 90\nfun 150"),
)

TODO_LISTS = (
    (
        "Personal",
        (
            "Renew passport",
            "Book dentist appointment",
            "Call the bank",
            "Water plants",
            "Fix the bike",
            "Return library books",
            "Plan birthday party",
        ),
    ),
    (
        "Work",
        (
            "Prepare slides",
            "Review pull request",
            "Send weekly report",
            "Update roadmap",
            "Schedule one-on-ones",
            "Write design doc",
            "Clean up backlog",
        ),
    ),
    (
        "Home",
        (
            "Buy light bulbs",
            "Clean the gutters",
            "Replace air filter",
            "Paint the fence",
            "Organize garage",
            "Defrost freezer",
        ),
    ),
)
